"""explorer: find the fastest way to run an LLM fine-tuning job on given hardware.

Data flow, one module per step::

    study file -> spec (typed) -> space (search space) -> trial_config -> launch (Ray actor)
      -> worker (HF Trainer under torchrun) -> measurement -> study (Optuna storage)

Importing this package is cheap: torch, transformers and Ray are imported lazily where used.
"""

from explorer.errors import SpecError
from explorer.measurement import Measurement, Outcome
from explorer.trial_config import TrialConfig

__all__ = ["Measurement", "Outcome", "SpecError", "TrialConfig", "__version__"]
__version__ = "0.1.0"
