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

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explorer.spec import FaultKind, FaultSpec

__all__ = [
    "LAUNCHER_FAULTS",
    "WORKER_FAULTS",
    "InjectedFault",
    "expected_status",
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


def pick_fault(spec: FaultSpec | None, *, trial_number: int, attempt: int) -> InjectedFault | None:
    """The fault trial ``trial_number`` gets on its ``attempt`` (0: first), or ``None``.

    Drawn from ``spec.seed`` and the trial number alone, so the same study injects the same faults
    whatever ran before (a resumed study included).
    """
    if spec is None:
        return None
    if attempt == 0 and trial_number in spec.schedule:
        return InjectedFault(
            kind=spec.schedule[trial_number], at_step=spec.at_step, kill_after_s=spec.kill_after_s
        )
    rng = random.Random(f"fault:{spec.seed}:{trial_number}")
    rate = spec.rate if attempt == 0 else spec.retry_rate
    if rng.random() >= rate:
        return None
    return InjectedFault(kind=rng.choice(spec.kinds), at_step=spec.at_step, kill_after_s=spec.kill_after_s)


def expected_status(kind: str, *, retried: bool) -> str:
    """The status a trial given fault ``kind`` must end its attempt with.

    Args:
        retried: whether the attempt had retries left (``launcher.max_retries``).
    """
    if kind == "oom":
        return "oom"
    return "retry" if retried else "failed"
