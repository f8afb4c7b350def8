"""A configuration's ``SFTConfig`` (TRL): the ``TrainingArguments`` and how TRL's collator pads,
packs and truncates."""

from __future__ import annotations

from typing import Any

from explorer.trial_config import TrialConfig

__all__ = ["sft_config_kwargs"]


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
