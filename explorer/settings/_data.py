"""How a batch is made (the ``padding`` knob): padded to ``model_max_length``, to the batch's
longest entry, or packed (padding-free: the entries concatenated into one row, position ids
restarting at each; transformers' ``DataCollatorWithFlattening``).

:func:`collator_for` is the benchmark's (its items come padded to ``model_max_length`` with an
``attention_mask``); :class:`PaddingCollator` is the same for a user's plain ``Trainer``, whose
items may come unpadded. TRL's ``SFTTrainer`` makes its own from ``sft_config.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["PAD_ID", "PaddingCollator", "collator_for", "pad_item"]

PAD_ID = 0


def pad_item(ids: torch.Tensor, max_length: int) -> dict[str, torch.Tensor]:
    """Truncate and right-pad one entry; padding is masked out of attention and loss."""
    import torch

    ids = ids[:max_length]
    n = ids.numel()
    input_ids = torch.full((max_length,), PAD_ID, dtype=torch.long)
    input_ids[:n] = ids
    mask = torch.zeros(max_length, dtype=torch.long)
    mask[:n] = 1
    labels = input_ids.masked_fill(mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def _unpadded(item: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    n = int(item["attention_mask"].sum())
    return {"input_ids": item["input_ids"][:n]}


def _longest(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The batch padded to its longest entry only."""
    import torch

    n = max(int(item["attention_mask"].sum()) for item in items)
    return {key: torch.stack([item[key][:n] for item in items]) for key in items[0]}


def collator_for(padding: str = "max_length") -> Any:
    """The data collator of a ``padding`` mode over items padded to ``model_max_length`` (``None``:
    the Trainer's default, which stacks the items as they are)."""
    if padding == "max_length":
        return None
    if padding == "longest":
        return _longest
    if padding == "packed":
        from transformers import DataCollatorWithFlattening

        flatten = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)
        return lambda items: flatten([_unpadded(item) for item in items])
    raise ValueError(f"unknown padding {padding!r}")


class PaddingCollator:
    """A plain ``Trainer``'s data collator for a configuration's ``padding`` (no
    ``TrainingArguments`` field packs): each item's ``input_ids`` (a list or tensor, padded or not;
    an ``attention_mask``, where given, marks its tokens) truncated to ``max_length``, then made
    into a batch as the benchmark makes it."""

    def __init__(self, padding: str, max_length: int) -> None:
        if padding not in ("max_length", "longest", "packed"):
            raise ValueError(f"unknown padding {padding!r}")
        self.padding = padding
        self.max_length = max_length
        self._collate = collator_for(padding) or _stacked

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return dict(self._collate([pad_item(_tokens(item), self.max_length) for item in items]))

    def __repr__(self) -> str:
        return f"PaddingCollator(padding={self.padding!r}, max_length={self.max_length})"


def _tokens(item: dict[str, Any]) -> torch.Tensor:
    import torch

    ids = torch.as_tensor(item["input_ids"], dtype=torch.long)
    mask = item.get("attention_mask")
    return ids[: int(torch.as_tensor(mask).sum())] if mask is not None else ids


def _stacked(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    import torch

    return {key: torch.stack([item[key] for item in items]) for key in items[0]}
