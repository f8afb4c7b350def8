"""What each knob's value needs of this process, and the weights' dtype. Liger's kernels and
selective checkpointing are :mod:`explorer.settings`' (re-exported here): a user's run applies
them with the same calls."""

from __future__ import annotations

import torch

from explorer.knobs import knobs
from explorer.settings import apply_liger, apply_selective_checkpointing, checkpointed_layers
from explorer.trial_config import TrialConfig

__all__ = [
    "apply_liger",
    "apply_selective_checkpointing",
    "checkpointed_layers",
    "model_dtype",
    "unmet_needs",
]


class UnmetNeed(RuntimeError):
    """A knob's value that this process cannot run (no CUDA, a package that does not import)."""


def unmet_needs(config: TrialConfig, *, device_type: str, model_type: str | None) -> None:
    """Raise :class:`UnmetNeed` naming the knob and the reason when a value of ``config``
    needs what this process lacks (checked again here: the study's machine may differ)."""
    for k in knobs():
        value = getattr(config, k.name)
        needs = k.needs.get(value)
        if needs is None:
            continue
        problem = needs.unmet(value, device=device_type, model_type=model_type) or needs.missing_module(value)
        if problem:
            raise UnmetNeed(
                f"{k.name}: {problem}".replace("resources.device is cpu", "this rank trains on the CPU")
            )


def model_dtype(config: TrialConfig) -> torch.dtype:
    """The weights' dtype: float32 master weights (mixed precision), or bfloat16 throughout."""
    return torch.bfloat16 if config.precision == "pure_bf16" else torch.float32
