"""The code that runs inside each training process of a trial (imports torch and transformers)."""
