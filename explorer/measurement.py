"""What a trial measured, in the seeds' (ado SFTTrainer) property names."""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Measurement", "Outcome", "Properties", "memory_headroom"]


def memory_headroom(peak_gib: float | None, limit_gib: float | None) -> float | None:
    """The fraction of the memory limit a trial left unused: ``1 - peak_gib / limit_gib`` (negative:
    over the limit); ``None`` without both figures."""
    if peak_gib is None or limit_gib is None or not limit_gib > 0:
        return None
    return 1.0 - peak_gib / limit_gib


class Outcome(str, enum.Enum):
    """How a trial ended."""

    OK = "ok"
    """Trained and measured."""
    OOM = "oom"
    """Ran out of device memory: infeasible, the sampler learns from it."""
    INVALID = "invalid"
    """Broke an is_valid rule before launch: infeasible, nothing ran."""
    FAILED = "failed"
    """Any other error (crash, NCCL, timeout): Optuna FAIL, retried."""


@dataclass(frozen=True, kw_only=True)
class Properties:
    """Measured properties of a feasible trial.

    Throughputs cover the measured window only: warmup steps are excluded.
    """

    dataset_tokens_per_second: float
    """Dataset tokens consumed per second, all processes together. Each consumed entry counts
    ``min(len(tokens), model_max_length)``: padding is not counted."""
    dataset_tokens_per_second_per_gpu: float
    """``dataset_tokens_per_second / number_gpus``: the study's objective."""
    train_tokens_per_second: float
    """Tokens fed to the model per second, padding included."""
    train_runtime: float
    """Seconds from the start of the first training step to the end of the last one."""
    train_samples_per_second: float
    """Samples per second over the measured window."""
    train_steps_per_second: float
    """Optimizer steps per second over the measured window."""
    peak_memory_gib: float
    """Largest peak over the processes: ``torch.cuda.max_memory_reserved`` on CUDA; on CPU the peak
    resident set above the process's size before the model was built."""
    peak_memory_allocated_gib: float
    """Largest ``torch.cuda.max_memory_allocated`` over the processes (equals peak RSS on CPU)."""
    measured_steps: int
    """Optimizer steps in the measured window."""
    warmup_steps: int
    """Optimizer steps excluded as warmup."""
    measured_seconds: float
    """Length of the measured window."""
    warmup_seconds: float
    """Training time excluded as warmup (from the start of the first step)."""
    step_time_mean: float
    """Mean optimizer-step time in the measured window, seconds."""
    step_time_cv: float
    """Coefficient of variation of the step times in the window."""
    step_time_rel_ci: float | None
    """Half-width of the 95% confidence interval of the mean step time, relative to it: the
    uncertainty of the throughput estimate (``None`` with fewer than 2 measured steps)."""
    stop_reason: str
    """Why measuring stopped: stable, max_steps, max_seconds, steps, stop_after_seconds, ..."""
    model_flops_per_token: float
    """Training FLOPs per token (see :mod:`explorer.flops` for the assumptions)."""
    peak_flops: float
    """Peak FLOP/s of one device: data-sheet bf16 on GPUs, a measured fp32 matmul rate on CPU."""
    mfu: float
    """Model FLOPs utilisation per device, from ``train_tokens_per_second``."""
    hfu: float
    """Hardware FLOPs utilisation (activation-checkpointing recompute counted)."""
    system: dict[str, float] = field(default_factory=dict)
    """The seeds' system metrics over the measured window (gpu_compute_utilization_min/avg/max,
    gpu_memory_utilization_*, gpu_memory_utilization_peak, gpu_power_watts_*, gpu_power_percent_*,
    cpu_compute_utilization, cpu_memory_utilization); GPU metrics are 0.0 without a GPU."""
    measured_dataset_tokens: int
    """Dataset tokens consumed in the measured window, all processes together."""
    measured_train_tokens: int
    """Tokens (padding included) fed in the measured window, all processes together."""
    measured_samples: int
    """Samples consumed in the measured window, all processes together."""
    device: str
    """``cuda`` or ``cpu``."""
    memory_limit_gib: float | None = None
    """The memory one process could use: the study's ``device_memory_gib`` cap, else the
    device's (CUDA: the GPU's memory; CPU: the host's divided by the processes on it)."""
    memory_headroom: float | None = None
    """:func:`memory_headroom` of ``peak_memory_gib`` and ``memory_limit_gib``."""

    def imprecise(self, target_rel_ci: float) -> str | None:
        """A warning when the throughput's 95% interval is wider than ``target_rel_ci`` (the
        study's ``measurement.target_rel_ci``), else ``None``."""
        ci = self.step_time_rel_ci
        if ci is None or ci <= target_rel_ci:
            return None
        advice = _LONGER_WINDOW.get(self.stop_reason)
        return (
            f"imprecise: step-time 95% CI +-{100 * ci:.1f}% misses the +-{100 * target_rel_ci:.2g}% target "
            f"(stopped: {self.stop_reason})"
            + (f"; a busy machine or too few steps: measure again or {advice}" if advice else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """Flat: the system metrics appear under their own names."""
        data = dataclasses.asdict(self)
        data.update(data.pop("system"))
        return data


_LONGER_WINDOW = {
    "steps": "raise measured_steps",
    "max_steps": "raise max_steps",
    "max_seconds": "raise max_seconds",
    "stop_after_seconds": "raise stop_after_seconds",
    "warmup_then_stable": "raise stable_seconds or stable_steps",
    "end of data": "give the dataset more entries",
}
"""What lengthens the measured window, by what ended it (the stop rule's ``stop_reason``): the
advice of :meth:`Properties.imprecise` names the field of the rule in use."""


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """The result of one trial, as the launcher returns it to the study."""

    outcome: Outcome
    properties: Properties | None = None
    """Set when ``outcome`` is OK."""
    error: str | None = None
    """Why the trial is infeasible or failed (one line where possible)."""
    wall_seconds: float = 0.0
    """Wall time of the whole trial, process start-up included."""
    log_tail: str = ""
    """The last lines of the training processes' output."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Context for users, JSON values (the wrapper trained, the Ray node that ran it, ...)."""

    @property
    def is_valid(self) -> int:
        """The seeds' is_valid: 1 for a measured trial, 0 for OOM or a broken rule."""
        return 1 if self.outcome is Outcome.OK else 0

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["outcome"] = self.outcome.value
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        data = json.loads(text)
        props = data.pop("properties")
        return cls(
            outcome=Outcome(data.pop("outcome")),
            properties=Properties(**props) if props is not None else None,
            **data,
        )
