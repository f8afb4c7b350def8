"""What a configuration does to the model that no ``TrainingArguments`` field does: some decoder
layers checkpointed (``checkpoint_fraction``), and Liger's kernels patched with a report of what
changed (the benchmark's way; a user's Trainer takes ``use_liger_kernel``).

Each function returns what it did: a run shows whether a kernel was really patched or how many
layers were really checkpointed, not only what was asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explorer.trial_config import TrialConfig

__all__ = ["apply_liger", "apply_selective_checkpointing", "checkpointed_layers", "decoder_layers"]


def apply_liger(model: Any, config: TrialConfig) -> dict[str, Any]:
    """Patch Liger Kernel's fused kernels into ``model`` (in place) when the knob asks for them.

    Liger's function for the model type runs with its own defaults; what it really changed is
    read back, by name (``{"liger": "off"}`` when the knob is off):

    * ``loss``: ``fused_linear_cross_entropy`` (the model's forward replaced: the logits are never
      built), ``cross_entropy`` (torch's cross entropy replaced: the logits are still built; Liger's
      granite patch can do no better, as granite scales its logits) or ``none``;
    * ``rope``: the modeling module's rotary function replaced;
    * ``modules``: the model's modules whose forward Liger replaced, counted by class
      (``LlamaRMSNorm``, ``LlamaMLP``, ...); ``patched``: their total;
    * ``classes``: the modeling module's classes replaced (they reach models built later).

    Raises:
        RuntimeError: a model type Liger does not know, or one of which Liger patched nothing.
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
    before = _liger_targets(base)
    _apply_liger_kernel_to_instance(model=base)
    report = _liger_report(before, _liger_targets(base))
    if report["patched"] == 0 and report["loss"] == "none" and not report["rope"]:
        raise RuntimeError(f"liger_kernel: Liger patched no module of this {model_type} model")
    return {"liger": {"model_type": model_type, **report}}


def _liger_targets(model: Any) -> dict[str, Any]:
    """What Liger may replace: torch's cross entropy, the model's forward, the modeling module's
    functions and classes, and each module's forward (by name, with its class)."""
    import sys

    import torch

    modeling = sys.modules[type(model).__module__]
    return {
        "cross_entropy": torch.nn.functional.cross_entropy,
        "forward": model.__dict__.get("forward", type(model).forward),
        "module": dict(vars(modeling)),
        "forwards": {
            name: (type(m).__name__, m.__dict__.get("forward", type(m).forward))
            for name, m in model.named_modules()
            if name
        },
    }


def _liger_report(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The patches, by name, between two :func:`_liger_targets` readings."""
    if after["forward"] is not before["forward"]:
        loss = "fused_linear_cross_entropy"
    elif after["cross_entropy"] is not before["cross_entropy"]:
        loss = "cross_entropy"
    else:
        loss = "none"
    changed = [k for k, v in after["module"].items() if before["module"].get(k) is not v]
    modules: dict[str, int] = {}
    for name, (cls, forward) in after["forwards"].items():
        if forward is not before["forwards"].get(name, (cls, forward))[1]:
            modules[cls] = modules.get(cls, 0) + 1
    return {
        "loss": loss,
        "rope": any("rotary" in k for k in changed),
        "modules": dict(sorted(modules.items())),
        "patched": sum(modules.values()),
        "classes": sorted(k for k in changed if isinstance(after["module"][k], type)),
    }


def checkpointed_layers(n_layers: int, fraction: float) -> list[int]:
    """The decoder layers to checkpoint: ``floor(fraction * n_layers)`` of them, spread evenly
    (0.5 of 8: layers 1, 3, 5, 7; 0.25 of 8: 3 and 7)."""
    return [i for i in range(n_layers) if int((i + 1) * fraction + 1e-9) > int(i * fraction + 1e-9)]


def apply_selective_checkpointing(model: Any, fraction: float) -> dict[str, Any]:
    """Checkpoint a ``fraction`` of ``model``'s decoder layers (transformers'
    ``GradientCheckpointingLayer`` blocks), non-reentrant, so that it works alone, under DDP and
    under FSDP1/FSDP2 alike. Returns ``{"checkpointed_layers": [k, n]}``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    enable = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    layers = decoder_layers(model)
    chosen = set(checkpointed_layers(len(layers), fraction))
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i in chosen
    return {"checkpointed_layers": [len(chosen), len(layers)]}


def decoder_layers(model: Any) -> list[Any]:
    """``model``'s decoder layers (transformers' ``GradientCheckpointingLayer`` blocks), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
