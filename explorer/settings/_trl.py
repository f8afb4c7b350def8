"""A configuration's ``SFTConfig`` (TRL): the ``TrainingArguments`` and how TRL's collator pads,
packs and truncates."""

from __future__ import annotations

from typing import Any

from explorer.trial_config import TrialConfig

__all__ = ["sft_config_kwargs", "trl_refusal"]


def sft_config_kwargs(config: TrialConfig, training: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of TRL's ``SFTConfig`` for ``config``: ``training`` (its
    ``TrainingArguments``, Liger's ``use_liger_kernel`` among them) and TRL's own fields.

    ``padding``: ``packed`` is TRL's ``padding_free`` (a batch's entries concatenated into one
    row, position ids restarting at each: transformers' flattening, as the benchmark trains it),
    not TRL's ``packing`` (which bins entries into rows of ``max_length`` before batching).
    TRL enforces no ``max_length`` in padding-free mode without packing (it refuses one): the data
    must come truncated to ``model_max_length`` (``run_settings.json`` says so).
    ``max_length``: every batch padded to ``model_max_length`` (``pad_to_multiple_of``);
    ``longest``: to the batch's longest entry.
    """
    length = int(config.model_max_length)
    padding = config.padding
    trl: dict[str, Any] = {
        "packing": False,
        "padding_free": padding == "packed",
        "max_length": None if padding == "packed" else length,
        "pad_to_multiple_of": length if padding == "max_length" else None,
    }
    return {**training, **trl}


def trl_refusal(name: str, value: Any) -> str | None:
    """Why TRL's ``SFTConfig`` cannot express knob ``name`` at ``value`` (``None``: it can).

    ``checkpoint_fraction`` below 1: ``SFTConfig.gradient_checkpointing`` checkpoints every decoder
    layer or none; some layers only needs explorer's ``RunSettings.prepare_model``, which a stock
    ``SFTTrainer`` script does not call.
    """
    if name == "checkpoint_fraction" and float(value) < 1.0:
        return (
            f"checkpoint_fraction {value}: TRL's SFTConfig checkpoints every decoder layer or none "
            "(gradient_checkpointing); search 1.0 only, or use workload.trainer: transformers"
        )
    return None
