"""The worst-case step: certify a trial's peak memory for the longest batch the real run can meet.

Where batches change shape from step to step (``padding`` in :data:`VARYING_SHAPES`: ``longest``,
``packed``), the measured steps see a few batches of the dataset, and their peak is that of those
batches, not of the longest batch the real run will meet. So after the measured window (never in
it: the throughput is untouched), every rank trains one more real step, forward, backward and
optimizer, on a batch of ``per_device_batch_size`` full-length entries (``model_max_length``
tokens each) through the trial's own collator. Its memory counts in the trial's peak, and an
out-of-memory there is the trial's OOM. With ``max_length`` padding every batch already has that
shape, so there is nothing to certify.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from explorer.job import TrialJob
from explorer.trial_config import VARYING_SHAPES, TrialConfig
from explorer.worker._memory import is_oom, peak_memory_bytes

__all__ = ["full_length_batch", "varies_shape", "worst_case_step"]

GIB = 2**30


def varies_shape(config: TrialConfig) -> bool:
    """Whether ``config``'s batches change shape from step to step (a worst case to certify)."""
    return config.padding in VARYING_SHAPES


def full_length_batch(config: TrialConfig, *, vocab_size: int, collator: Any) -> dict[str, torch.Tensor]:
    """A micro-batch of ``per_device_batch_size`` entries of ``model_max_length`` tokens each, made
    by ``collator`` (``None``: stacked as they are) as the trial makes its batches."""
    from explorer.worker._data import pad_item

    length = int(config.model_max_length)
    items = []
    for i in range(config.per_device_batch_size):
        ids = (torch.arange(length, dtype=torch.long) * 31 + i * 7919) % (vocab_size - 1) + 1
        items.append(pad_item(ids, length))
    if collator is None:
        return {key: torch.stack([item[key] for item in items]) for key in items[0]}
    return dict(collator(items))


def worst_case_step(trainer: Any, job: TrialJob, *, vocab_size: int, baseline_rss: int) -> dict[str, Any]:
    """Train one step on :func:`full_length_batch` with the trainer's model, optimizer and collator
    (after ``trainer.train()``), on every rank; what it did, for the measurement's ``extra``.

    Raises:
        MemoryError: the step ran out of memory (naming the worst-case step; the trial is OOM).
    """
    from transformers import Trainer

    c = job.config
    if not job.worst_case_step or not varies_shape(c):
        why = (
            "off for this job"
            if not job.worst_case_step
            else f"padding {c.padding}: every batch is full-length"
        )
        return {"ran": False, "why": why}
    device = trainer.args.device
    before = peak_memory_bytes(device, baseline_rss=baseline_rss)[0]
    batch = full_length_batch(c, vocab_size=vocab_size, collator=trainer.data_collator)
    model = trainer.model_wrapped
    start = time.perf_counter()
    try:
        Trainer.training_step(trainer, model, batch)  # the Trainer's own step, uncounted
        if trainer.args.max_grad_norm:
            trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        if is_oom(exc):
            raise MemoryError(
                f"worst-case step ({c.per_device_batch_size} entries of {c.model_max_length} tokens, "
                f"padding {c.padding}): {type(exc).__name__}: {exc}"
            ) from exc
        raise
    after = peak_memory_bytes(device, baseline_rss=baseline_rss)[0]
    return {
        "ran": True,
        "entries": c.per_device_batch_size,
        "tokens": int(batch["input_ids"].numel()),
        "seconds": round(time.perf_counter() - start, 4),
        "peak_before_gib": before / GIB,
        "peak_after_gib": after / GIB,
    }
