"""Step timing and token counting inside the HF Trainer.

Tokens are counted from each micro-batch actually fed to the model (``attention_mask.sum()`` is
the number of dataset tokens, ``input_ids.numel()`` the tokens with padding); the step clock is
read at every optimizer-step boundary, after a device synchronisation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from explorer.settings import FsdpOnCpu
from explorer.spec import MeasurementSpec
from explorer.worker._compile import compile_count, compiling_steps
from explorer.worker._stopping import Decision, decide, warmup_at_least

__all__ = ["CountingTrainer", "StepClock", "StepLog", "TokenCounting"]


@dataclass
class StepLog:
    """Per-rank record of the run: cumulative counters at the end of each optimizer step."""

    start: float | None = None
    """Clock at the start of the first step."""
    ends: list[float] = field(default_factory=list)
    """Clock at the end of optimizer step i (index 0 is step 1)."""
    dataset_tokens: list[int] = field(default_factory=list)
    train_tokens: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    compiles: list[int] = field(default_factory=list)
    """Compiled trials: graphs dynamo compiled from the start of step 1 to the end of step i."""
    # running totals, updated per micro-batch
    run_dataset_tokens: int = 0
    run_train_tokens: int = 0
    run_samples: int = 0


class TokenCounting:
    """Counts the tokens of every micro-batch the trainer trains on, before its training step:
    put first among a trainer's bases (``Trainer``, TRL's ``SFTTrainer``).

    Dataset tokens are the batch's non-padding tokens (``attention_mask.sum()``; a padding-free
    batch has no padding: all of its tokens); samples are its rows, or a padding-free row's
    entries (each starts at position 0)."""

    step_log: StepLog

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        mask = inputs.get("attention_mask")
        ids = inputs["input_ids"]
        log = self.step_log
        log.run_dataset_tokens += int(mask.sum()) if mask is not None else ids.numel()
        log.run_train_tokens += ids.numel()
        positions = inputs.get("position_ids")
        if mask is None and positions is not None:  # packed: one row of entries, each from position 0
            log.run_samples += int(positions.eq(0).sum())
        else:
            log.run_samples += ids.shape[0]
        return super().training_step(model, inputs, num_items_in_batch)  # type: ignore[misc]


class CountingTrainer(TokenCounting, FsdpOnCpu, Trainer):
    """A Trainer that counts the tokens of every micro-batch it trains on.

    On the CPU it runs FSDP through :class:`explorer.settings.FsdpOnCpu` (accelerate ignores FSDP
    there); on CUDA that is a no-op.
    """


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock(TrainerCallback):
    """Records step boundaries and applies the stop rule after every optimizer step.

    Rank 0's decision is all-reduced, so every rank stops after the same step. ``compiled``: the
    warmup also covers every step in which dynamo compiled, on any rank.
    """

    def __init__(
        self, log: StepLog, *, device: torch.device, spec: MeasurementSpec, compiled: bool = False
    ) -> None:
        self.log = log
        self.device = device
        self.spec = spec
        self.compiled = compiled
        self.decision = Decision(warmup=spec.warmup_steps, stop=False)
        self._graphs_before = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.log.start is None:
            self._graphs_before = compile_count()
            _sync(self.device)
            self.log.start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _sync(self.device)
        log = self.log
        log.ends.append(time.perf_counter())
        log.dataset_tokens.append(log.run_dataset_tokens)
        log.train_tokens.append(log.run_train_tokens)
        log.samples.append(log.run_samples)
        start = log.start or log.ends[0]
        spec = self.spec
        if self.compiled:
            log.compiles.append(compile_count() - self._graphs_before)
            steps = compiling_steps(log.compiles)
            last = _max_over_ranks(steps[-1] if steps else 0, self.device)
            spec = warmup_at_least(spec, last, start=start, ends=log.ends)
        decision = decide(spec, start=start, ends=log.ends)
        if _agree(decision.stop, self.device):
            self.decision = Decision(warmup=decision.warmup, stop=True, reason=decision.reason or "rank 0")
            control.should_training_stop = True
        else:
            self.decision = decision


def _agree(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag``, on every rank (an all-reduce, so that all ranks stop at the same step)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    return bool(_max_over_ranks(1 if flag and dist.get_rank() == 0 else 0, device))


def _max_over_ranks(value: int, device: torch.device) -> int:
    """The largest ``value`` of all ranks (``value`` itself in a one-process run)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
