"""GPU-slot utilization of a study, from the ``slot`` user attribute of its stored trials.

Over one launcher run (the slots that share a ``run`` id, hence a clock and a pool of G GPUs)::

    utilization = sum(gpus * (end - start)) / (G * (last end - first start))

Over several runs (a resumed study) the GPU-seconds and the capacities are summed run by run, so
the time between runs does not count. Trials answered without running (reused, inferred, invalid)
hold no GPUs and have no slot; an interrupted trial's slot is not known and is left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.launch._slot import SLOT_ATTR, GpuSlot
from explorer.record import TrialRecord

if TYPE_CHECKING:
    import optuna

__all__ = ["Utilization", "slots_of", "study_utilization", "utilization"]


@dataclass(frozen=True, kw_only=True)
class Utilization:
    """How busy a study kept its GPUs."""

    busy_gpu_seconds: float
    """GPU-seconds held by trials: the sum of ``gpus * (end - start)``."""
    capacity_gpu_seconds: float
    """The pool's GPU-seconds over each run's span, summed over runs."""
    makespan_s: float
    """From each run's first start to its last end, summed over runs."""
    trials: int
    """Trials with a slot."""
    runs: int
    """Launcher runs the slots came from."""
    pool: int
    """GPUs of the pool (the largest over the runs)."""
    clock: str
    """``virtual`` (replay), ``wall``, or ``mixed``."""

    @property
    def fraction(self) -> float | None:
        """``busy / capacity``; ``None`` when no time passed."""
        return self.busy_gpu_seconds / self.capacity_gpu_seconds if self.capacity_gpu_seconds > 0 else None

    def describe(self) -> str:
        """One line for people."""
        if self.fraction is None:
            return f"GPU-slot utilization: - ({self.trials} trials took no {self.clock} time)"
        runs = f" in {self.runs} runs" if self.runs > 1 else ""
        return (
            f"GPU-slot utilization: {100 * self.fraction:.1f}% ({self.busy_gpu_seconds:.0f} of "
            f"{self.capacity_gpu_seconds:.0f} GPU-s; {self.trials} trials on {self.pool} GPUs over "
            f"{self.makespan_s:.0f} s{runs}, {self.clock} clock)"
        )


def utilization(slots: Iterable[GpuSlot]) -> Utilization | None:
    """Utilization of ``slots``; ``None`` if there are none."""
    by_run: dict[str, list[GpuSlot]] = {}
    for slot in slots:
        by_run.setdefault(slot.run, []).append(slot)
    if not by_run:
        return None
    busy = capacity = makespan = 0.0
    clocks: set[str] = set()
    for run, held in by_run.items():
        pools = {s.pool for s in held}
        if len(pools) != 1:
            raise ValueError(f"run {run} has slots on pools of {sorted(pools)} GPUs")
        span = max(s.end for s in held) - min(s.start for s in held)
        busy += sum(s.gpu_seconds for s in held)
        capacity += pools.pop() * span
        makespan += span
        clocks |= {s.clock for s in held}
    return Utilization(
        busy_gpu_seconds=busy,
        capacity_gpu_seconds=capacity,
        makespan_s=makespan,
        trials=sum(len(held) for held in by_run.values()),
        runs=len(by_run),
        pool=max(s.pool for held in by_run.values() for s in held),
        clock=clocks.pop() if len(clocks) == 1 else "mixed",
    )


def slots_of(trials: Iterable[optuna.trial.FrozenTrial]) -> list[GpuSlot]:
    """The slots stored in ``trials`` (trials without one are skipped).

    Raises:
        ValueError: a stored slot that does not parse.
    """
    slots = []
    for t in trials:
        record = TrialRecord.of(t)
        if record.has(SLOT_ATTR):
            try:
                slots.append(GpuSlot.from_attr(record[SLOT_ATTR]))
            except ValueError as exc:
                raise ValueError(f"trial {t.number}: {exc}") from None
    return slots


def study_utilization(study: optuna.Study) -> Utilization | None:
    """Utilization of every stored trial of ``study`` (``None``: no trial held GPUs)."""
    return utilization(slots_of(study.get_trials(deepcopy=False)))
