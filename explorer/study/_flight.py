"""The optimize loop's trials between ask and tell: waiting for GPUs (first fit), asked in the
driver's turn, waiting for another driver's answer, finished as a failed twin, or abandoned on
Ctrl-C."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.record import Key, Status, TrialRecord, write, write_status
from explorer.search._strategy import Strategy
from explorer.spec import LoadedStudy
from explorer.study._known import Known
from explorer.study._peers import WAITS_FOR, claim, running_elsewhere, settled
from explorer.study._proposals import propose
from explorer.study._record import (
    answered_without_running,
    frozen,
    record_driver,
    record_reuse,
    status_of,
)
from explorer.study._recover import requeue
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

__all__ = ["InFlight", "abandon", "ask_trial", "fail_as", "next_to_start", "settle_remote"]

Printer = Callable[[str], None]


@dataclass
class InFlight:
    trial: optuna.Trial
    config: TrialConfig
    attempt: int
    passed_over: int = 0
    """While it waits for GPUs: times a younger waiting trial started ahead of it."""


def next_to_start(
    pending: list[InFlight], fits: Callable[..., bool], max_passed_over: int
) -> InFlight | None:
    """The waiting trial to start now, taken out of ``pending`` (``None``: none can start).

    First fit, oldest first. When a younger trial starts ahead of the oldest, the oldest is passed
    over once more; once it has been passed over ``max_passed_over`` times it is reserved: nothing
    else starts until it fits (the GPUs drain for it), so a large trial is never starved.
    """
    for i, flight in enumerate(pending):
        model = flight.config.gpu_model  # None: the study's one model
        by_model = {} if model is None else {"gpu_model": model}
        if fits(flight.config.number_gpus, flight.config.number_nodes, **by_model):
            if i > 0:
                pending[0].passed_over += 1
            return pending.pop(i)
        if i == 0 and flight.passed_over >= max_passed_over:
            return None
    return None


def ask_trial(
    study: optuna.Study,
    loaded: LoadedStudy,
    known: Known,
    strategy: Strategy,
    in_flight: dict[int, InFlight],
    pending: list[InFlight],
    reuse_streak: int,
    peers: bool,
) -> tuple[optuna.Trial, TrialConfig, int, optuna.trial.FrozenTrial | None]:
    """Enqueue the strategy's proposal, ask and tag a trial (in the driver's turn); returns it, its
    configuration, its attempt, and the trial of another driver measuring that configuration right
    now, if any (the new trial is then tagged as waiting for it)."""
    waiting = [*in_flight.values(), *pending]
    propose(study, loaded, strategy, known, (f.config for f in waiting), reuse_streak)
    trial = study.ask()
    config = loaded.space.suggest(trial)
    attempt = TrialRecord.of(trial).attempt
    record_driver(trial, config, attempt)
    elsewhere = running_elsewhere(study, known, config.key()) if peers else None
    if elsewhere is not None and config.key() not in known.measured:
        write(trial, {WAITS_FOR: elsewhere.number})
        return trial, config, attempt, elsewhere
    return trial, config, attempt, None


def settle_remote(
    study: optuna.Study,
    remote: list[tuple[InFlight, optuna.trial.FrozenTrial]],
    rerun: Callable[[InFlight], None],
    known: Known,
    printer: Printer,
    turn: Callable[[], contextlib.AbstractContextManager[None]],
) -> None:
    """Answer the trials waiting for another driver's trial that has ended: reused from its
    measurement (ok, oom), failed like it (failed for good), or else (retried, interrupted, its
    driver died) claimed in the driver's ``turn`` (:func:`~explorer.study._peers.claim`) and
    handed to ``rerun`` (the loop: answered from a twin here, or run)."""
    for entry in list(remote):
        flight, source = entry
        now = settled(study, source)
        if now is None:
            continue
        remote.remove(entry)
        status = status_of(now)
        if now.state.is_finished() and status in ("ok", "oom"):
            origin = known.measured.get(flight.config.key())
            if origin is None and not answered_without_running(now):
                known.learn(now, flight.config)
                origin = now
            record_reuse(study, flight.trial, origin or now)
            printer(f"        trial {flight.trial.number} {status}: reused trial {(origin or now).number}")
        elif now.state.is_finished() and status == "failed":
            fail_as(study, flight, now.number)
        elif (other := claim(study, known, flight.trial, flight.config.key(), turn)) is not None:
            # its retry (or another twin) runs in another driver now, started while this one
            # still waited: wait for that one instead of measuring the configuration twice
            remote.append((flight, other))
        else:
            rerun(flight)


def fail_as(study: optuna.Study, twin: InFlight, number: int) -> None:
    """Finish ``twin`` as failed, like trial ``number`` of the same configuration (not counted)."""
    import optuna

    write(
        twin.trial,
        {
            Key.STATUS: Status.FAILED,
            Key.REUSED_FROM: number,
            Key.WALL_SECONDS: 0.0,
            Key.ERROR: f"same configuration as trial {number}, which failed (retries exhausted)",
        },
    )
    study.tell(twin.trial, state=optuna.trial.TrialState.FAIL)


def abandon(study: optuna.Study, flights: list[InFlight]) -> None:
    import optuna

    for flight in flights:
        write_status(flight.trial, Status.INTERRUPTED, "explorer was interrupted; re-run on resume")
        study.tell(flight.trial, state=optuna.trial.TrialState.FAIL)
        requeue(study, frozen(study, flight.trial), attempt=flight.attempt, why="interrupted")
