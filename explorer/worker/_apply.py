"""The knobs the worker applies to the model itself (the rest reach ``TrainingArguments``, the
model's constructor or the collator through :func:`explorer.knobs.run_options`): what each
value needs of this process, the weights' dtype, Liger's kernels and selective checkpointing.

Each function returns what it did, for the measurement's ``extra``: a trial shows whether a
kernel was really patched or how many layers were really checkpointed, not only what was asked.
"""

from __future__ import annotations

from typing import Any

import torch

from explorer.knobs import knobs
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


def apply_liger(model: Any, config: TrialConfig) -> dict[str, Any]:
    """Patch Liger Kernel's fused kernels into ``model`` (in place) when the knob asks for them.

    Returns what happened: ``{"liger": "off"}``, or the model type and the modules whose class
    or forward Liger replaced (``patched``: their count; 0 says nothing changed, and why).
    """
    if not config.liger_kernel:
        return {"liger": "off"}
    from liger_kernel.transformers.monkey_patch import (
        MODEL_TYPE_TO_APPLY_LIGER_FN,
        _apply_liger_kernel_to_instance,
    )

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    model_type = getattr(base.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise RuntimeError(
            f"liger_kernel: the installed liger_kernel does not support model_type {model_type!r}"
        )
    before = _forwards(base)
    _apply_liger_kernel_to_instance(model=base)
    patched = sum(1 for name, forward in _forwards(base).items() if forward is not before.get(name))
    if patched == 0:
        raise RuntimeError(f"liger_kernel: Liger patched no module of this {model_type} model")
    return {"liger": {"model_type": model_type, "patched": patched}}


def _forwards(model: Any) -> dict[str, Any]:
    """Each module's forward as the module would call it (an instance override or its class's)."""
    return {name: m.__dict__.get("forward", type(m).forward) for name, m in model.named_modules()}


def checkpointed_layers(n_layers: int, fraction: float) -> list[int]:
    """The decoder layers to checkpoint: ``floor(fraction * n_layers)`` of them, spread evenly
    (0.5 of 8: layers 1, 3, 5, 7; 0.25 of 8: 3 and 7)."""
    return [i for i in range(n_layers) if int((i + 1) * fraction + 1e-9) > int(i * fraction + 1e-9)]


def apply_selective_checkpointing(model: Any, fraction: float) -> dict[str, Any]:
    """Checkpoint a ``fraction`` of ``model``'s decoder layers (transformers'
    ``GradientCheckpointingLayer`` blocks), non-reentrant, so that it works alone, under DDP and
    under FSDP1/FSDP2 alike. Returns ``{"checkpointed_layers": [k, n]}``."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    enable = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
    chosen = set(checkpointed_layers(len(layers), fraction))
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i in chosen
    return {"checkpointed_layers": [len(chosen), len(layers)]}
