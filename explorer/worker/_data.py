"""Training data for the benchmark: synthetic token entries or a tokenised JSONL file, and how a
batch of them is made (the ``padding`` knob).

Every item is right-padded to ``model_max_length``; ``attention_mask`` marks the dataset tokens,
so ``attention_mask.sum()`` is exactly ``min(len(tokens), model_max_length)`` per entry. The
collator then keeps that padding (``max_length``), trims a batch to its longest entry
(``longest``), or drops it and concatenates the entries into one row with position ids that
restart at every entry (``packed``: transformers' DataCollatorWithFlattening; the attention masks
built from those position ids keep every entry to itself). A packed batch has no attention mask:
each of its tokens is a dataset token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from explorer.settings import PAD_ID, collator_for, pad_item
from explorer.spec import DatasetSpec

__all__ = [
    "PAD_ID",
    "JsonlText",
    "Repeated",
    "SyntheticTokens",
    "collator_for",
    "entry_length",
    "filled",
    "pad_item",
]


def entry_length(spec: DatasetSpec, index: int) -> int:
    """Untruncated length, in tokens, of synthetic entry ``index``: drawn from a generator seeded
    by the dataset's seed and the index alone (the same entry always has the same length,
    whichever rank or step reads it), as ``spec.lengths`` says.

    * ``uniform``: an integer in ``[min_tokens, max_tokens]``, each equally likely;
    * ``lognormal``: ``round(median_tokens * exp(sigma * z))`` with ``z`` standard normal, clipped
      to ``[min_tokens, max_tokens]`` (clipping moves no length across the median, which stays
      ``median_tokens``).
    """
    lo, hi = spec.resolved_min_tokens, spec.resolved_max_tokens
    if lo == hi:
        return lo
    g = torch.Generator().manual_seed(spec.seed * 1_000_003 + index)
    if spec.lengths == "lognormal":
        assert spec.median_tokens is not None and spec.sigma is not None  # the spec checks it
        z = float(torch.randn((), generator=g))
        return min(hi, max(lo, round(spec.median_tokens * math.exp(spec.sigma * z))))
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


class SyntheticTokens(Dataset[dict[str, torch.Tensor]]):
    """Synthetic entries (a preset such as ado's ``news-tokens-16384plus-entries-4096`` or
    ``instruction-short``, or the spec's own lengths), made on the fly.

    Token ids are deterministic and lie in ``[1, vocab_size)``; only their count matters for
    throughput.
    """

    def __init__(self, spec: DatasetSpec, *, vocab_size: int, max_length: int) -> None:
        self.spec = spec
        self.vocab_size = vocab_size
        self.max_length = max_length

    def __len__(self) -> int:
        return self.spec.resolved_entries

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        n = min(entry_length(self.spec, index), self.max_length)
        ids = (torch.arange(n, dtype=torch.long) * 31 + index * 7919) % (self.vocab_size - 1) + 1
        return pad_item(ids, self.max_length)


class JsonlText(Dataset[dict[str, torch.Tensor]]):
    """A JSONL file whose ``text_field`` is tokenised with the model's tokenizer."""

    def __init__(self, path: Path, *, text_field: str, tokenizer: Any, max_length: int) -> None:
        self.items: list[dict[str, torch.Tensor]] = []
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if text_field not in record:
                    raise ValueError(f"{path}:{lineno}: no field {text_field!r}")
                ids = tokenizer(record[text_field], add_special_tokens=True)["input_ids"]
                self.items.append(pad_item(torch.tensor(ids, dtype=torch.long), max_length))
        if not self.items:
            raise ValueError(f"{path}: no entries")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.items[index]


class Repeated(Dataset[dict[str, torch.Tensor]]):
    """``base`` read round and round, ``length`` items long: item ``i`` is ``base[i % len(base)]``."""

    def __init__(self, base: Any, *, length: int) -> None:
        self.base = base
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.base[index % len(self.base)]


def filled(dataset: Any, samples_per_step: int) -> Any:
    """``dataset``, repeated to ``samples_per_step`` items when it has fewer: every step then
    trains on the full batch (a batch of 64 over 8 entries trains on 64 samples, each entry 8
    times), not on the few entries there are. A dataset as large as a step is as it is."""
    if len(dataset) >= samples_per_step:
        return dataset
    return Repeated(dataset, length=samples_per_step)
