"""explorer plan: time and cost of the real run."""
