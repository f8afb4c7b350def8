"""Injected faults (a study's ``faults:`` section): which trial gets which, and what each means.

The driver draws a trial's fault when it submits the trial and hands it over in the
:class:`~explorer.job.TrialJob`. Where it strikes:

* worker faults (``oom``, ``crash``, ``segfault``, ``hang``) in the training processes
  (:mod:`explorer.worker._fault`), as the ``at_step``-th optimizer step begins;
* launcher faults (``actor_kill``, ``node_restart``) in the Ray launcher, ``kill_after_s`` after
  the trial started;
* on the replay launcher, all of them are simulated (:func:`simulated_outcome`).

Each has one defined outcome, which :mod:`explorer.study._audit` checks: ``oom`` makes the trial
infeasible; every other fault fails the attempt, which is retried while ``launcher.max_retries``
allows and is then failed for good.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.record import Status, TrialRecord

if TYPE_CHECKING:
    import optuna

    from explorer.spec import FaultKind, FaultSpec

__all__ = [
    "LAUNCHER_FAULTS",
    "WORKER_FAULTS",
    "InjectedFault",
    "expected_status",
    "first_launches",
    "pick_fault",
]

WORKER_FAULTS = frozenset({"oom", "crash", "segfault", "hang"})
LAUNCHER_FAULTS = frozenset({"actor_kill", "node_restart"})
CRASH_EXIT_STATUS = 17


@dataclass(frozen=True, kw_only=True)
class InjectedFault:
    """One fault given to one attempt of a trial."""

    kind: FaultKind
    at_step: int = 1
    """Worker faults: the optimizer step (0-based) at whose beginning it strikes."""
    kill_after_s: float = 2.0
    """Launcher faults: seconds after the trial started."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_step": self.at_step, "kill_after_s": self.kill_after_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InjectedFault:
        return cls(kind=data["kind"], at_step=int(data["at_step"]), kill_after_s=float(data["kill_after_s"]))


def pick_fault(
    spec: FaultSpec | None, *, trial_number: int, attempt: int, launch: int
) -> InjectedFault | None:
    """The fault an attempt gets, or ``None``.

    Args:
        trial_number: the Optuna trial (``schedule`` is keyed by it; retries draw by it).
        attempt: 0 for a configuration's first attempt, then 1, 2, ... for its retries.
        launch: how many first attempts the study launched before this one.

    First attempts are given faults by their launch order, evenly: of any ``k`` launched in a row,
    ``rate * k`` (rounded down or up) get one, and the kinds take turns, so a run of 100 trials at
    rate 0.2 injects exactly 20 faults of every kind (answers given without launching, such as a
    reused measurement or an inferred OOM, take no turn). The phase and the first kind come from
    ``seed``. Retries draw by ``seed`` and trial number at ``retry_rate``.
    """
    if spec is None:
        return None
    if attempt == 0 and trial_number in spec.schedule:
        kind = spec.schedule[trial_number]
    elif attempt == 0:
        phase = random.Random(f"fault:{spec.seed}").random()
        turn = math.floor(launch * spec.rate + phase)
        if math.floor((launch + 1) * spec.rate + phase) == turn:
            return None
        kind = spec.kinds[(turn + spec.seed) % len(spec.kinds)]
    else:
        rng = random.Random(f"fault:{spec.seed}:{trial_number}:{attempt}")
        if rng.random() >= spec.retry_rate:
            return None
        kind = rng.choice(spec.kinds)
    return InjectedFault(kind=kind, at_step=spec.at_step, kill_after_s=spec.kill_after_s)


def first_launches(study: optuna.Study) -> int:
    """First attempts the study has launched (its trials that ran or were running, not retries)."""
    launched = (Status.OK, Status.OOM, Status.FAILED, Status.RETRY, Status.INTERRUPTED)
    records = (TrialRecord.of(t) for t in study.get_trials(deepcopy=False))
    return sum(
        1
        for r in records
        if r.status in launched
        and r.attempt == 0
        and not r.answered_without_running
        and r.reused_from_store is None
    )


def expected_status(kind: str, *, retried: bool) -> str:
    """The status a trial given fault ``kind`` must end its attempt with.

    Args:
        retried: whether the attempt had retries left (``launcher.max_retries``).
    """
    if kind == "oom":
        return "oom"
    return "retry" if retried else "failed"
