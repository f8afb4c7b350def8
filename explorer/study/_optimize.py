"""``explorer optimize``: the ask/tell loop that feeds Ray actors and records every outcome at once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.fault import first_launches, pick_fault
from explorer.job import TrialJob
from explorer.measurement import Measurement, Outcome
from explorer.search._inference import inferred_oom
from explorer.search._neighbours import LocalSearch
from explorer.secrets import mask_url
from explorer.spec import LoadedStudy
from explorer.study._flight import (
    InFlight,
    abandon,
    ask_trial,
    fail_as,
    next_to_start,
    settle_remote,
)
from explorer.study._interrupt import Interrupted, StopRequest, signal_name, signal_of
from explorer.study._journal import read_ahead
from explorer.study._journal import write_ahead as write_measurement
from explorer.study._known import Known
from explorer.study._lines import better, describe, progress_line, short, stored_best
from explorer.study._open import enqueue_grid, open_existing_study, open_study
from explorer.study._peers import WAITS_FOR, Drivers, occupancy
from explorer.study._record import (
    counted_trials,
    frozen,
    record_from_store,
    record_inferred_oom,
    record_outcome,
    record_reuse,
    set_user_attrs,
    status_of,
)
from explorer.study._recover import reclaim_interrupted, reclaim_orphans, requeue
from explorer.study._run_folder import check_run_folder, claim_run_folder
from explorer.study._storage import open_storage
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

if TYPE_CHECKING:
    import optuna

    from explorer.launch import Launcher
    from explorer.progress import ProgressHook

__all__ = ["OptimizeResult", "describe", "open_existing_study", "open_study", "optimize"]

Printer = Callable[[str], None]
MAX_REUSE_STREAK = 30
"""Stop asking after this many proposals in a row were all answered without running (already
measured, or inferred OOM): the sampler has nothing new to try."""
STOPPED_EARLY = "stopped_early"
"""Study user attr: why the last run ended short of ``n_trials`` (``None``: it did not)."""
ORPHAN_SWEEP_S = 10.0
"""How often the loop looks for trials asked by a driver that died before starting them."""


@dataclass(frozen=True)
class OptimizeResult:
    study_name: str
    storage_url: str
    counted: int
    n_trials: int
    wall_seconds: float
    statuses: dict[str, int]


def optimize(
    loaded: LoadedStudy,
    *,
    printer: Printer = print,
    launcher: Launcher | None = None,
    reclaim_all: bool = False,
    sampler: optuna.samplers.BaseSampler | None = None,
    storage: optuna.storages.BaseStorage | None = None,
    progress: ProgressHook | None = None,
    write_ahead: bool = True,
) -> OptimizeResult:
    """Run the study until ``n_trials`` trials count (resuming whatever is already stored).

    Args:
        sampler: instead of the study file's.
        storage: instead of the study's URL.
        progress: told the loop's state each time round (the CLI's live footer on a terminal).
        write_ahead: write each finished trial's measurement under ``output_dir`` before it is
            recorded, and recover such files on resume (:mod:`explorer.study._journal`);
            ``False`` for throw-away in-memory studies (``benchmark-search``).
    """
    from explorer.launch import launcher_for
    from explorer.store import MeasurementStore, StoreScope

    spec = loaded.spec
    started = time.monotonic()
    owned = write_ahead and loaded.storage_url not in ("sqlite://", "sqlite:///:memory:")  # kept files
    if owned:  # another storage's study owns the folder: refused before anything is written
        check_run_folder(loaded)
    storage = storage or open_storage(loaded.storage_url, field_file=str(loaded.file) + ": storage")
    study = open_study(loaded, create=True, sampler=sampler, storage=storage)
    drivers = Drivers.join(study)  # other drivers of this study: take turns, count what they do
    if owned:  # a throw-away study in memory claims no folder
        with drivers.turn():
            loaded = claim_run_folder(study, loaded)
    store = MeasurementStore.for_storage(storage) if spec.reuse_measurements else None
    scope = StoreScope.for_study(loaded) if store is not None else None
    journal = loaded.output_dir if write_ahead else None
    reclaimed = reclaim_interrupted(
        study,
        force=reclaim_all,
        recover=(lambda t: read_ahead(journal, spec.name, t)) if journal is not None else None,
    )
    if reclaimed.recovered:
        printer(f"resume: recorded trial(s) {reclaimed.recovered} from their measurement on disk")
    if reclaimed.requeued:
        printer(f"resume: re-enqueued interrupted trial(s) {reclaimed.requeued}")
    if reclaimed.abandoned:
        printer(
            f"resume: failed trial(s) {reclaimed.abandoned}, asked by a process that died before starting them"
        )
    if reclaimed.left:
        printer(
            f"note: trial(s) {reclaimed.left} are RUNNING under another live explorer process; left alone"
        )
    if spec.sampler.kind == "grid":
        added = enqueue_grid(study, loaded)
        if added:
            printer(f"grid: enqueued {added} configurations")
    done = len(counted_trials(study))
    printer(f"study {spec.name!r} in {mask_url(loaded.storage_url)}: {done}/{spec.n_trials} trials done")
    if getattr(storage, "url", None) == loaded.storage_url:  # the study's own: its schema is committed now
        import sys

        from explorer.commands import hint_lines

        for line in hint_lines(loaded):  # so a dashboard can be started at once (through a pipe too)
            printer(line)
        sys.stdout.flush()
    owns_launcher = launcher is None
    if launcher is None:
        launcher = launcher_for(loaded, output_dir=loaded.output_dir)
    in_flight: dict[int, InFlight] = {}
    twins: dict[str, list[InFlight]] = {}  # proposals of a configuration already in flight or pending
    remote: list[tuple[InFlight, optuna.trial.FrozenTrial]] = []  # waiting for another driver's trial
    pending: list[InFlight] = []  # asked, valid, waiting for GPUs to free up; oldest first
    best: tuple[float, int] | None = stored_best(study)
    known = Known.from_study(study)
    valid_configs: list[TrialConfig] = []  # for when_converged: explore, filled on first use
    local = (
        LocalSearch(
            space=loaded.space,
            resources=spec.resources,
            memory_prior=spec.sampler.memory_prior,
            throughput_prior=spec.sampler.throughput_prior,
            frontier=spec.sampler.frontier_start,
        )
        if spec.sampler.local_search and spec.sampler.kind in ("tpe", "gp")
        else None
    )
    reuse_streak = 0
    launcher_started = False
    timed_out = exhausted = False
    last_sweep = time.monotonic()
    peers = was_shared = False  # other drivers at work now / at the last ask
    launches = first_launches(study) if spec.faults is not None else 0  # first attempts launched so far

    def answered(streak: int, number: int, status: str, config: TrialConfig, why: str) -> int:
        """Print a proposal answered without running (reused or inferred); returns the new streak."""
        printer(progress_line(done, spec.n_trials, number, status, describe(config), why, best))
        if streak + 1 == MAX_REUSE_STREAK:
            printer(f"stopping: the last {MAX_REUSE_STREAK} proposals were all answered already")
        return streak + 1

    stop = StopRequest().install()  # SIGINT, SIGTERM, SIGHUP: a flag checked each time round
    try:
        while True:
            stop.check()  # a stop signal came: raises Interrupted
            if remote:
                settle_remote(study, remote, pending, known, printer)
            if progress is not None:
                progress.update(
                    done=done, total=spec.n_trials, running=len(in_flight), queued=len(pending), best=best
                )
            if time.monotonic() - last_sweep > ORPHAN_SWEEP_S:  # trials another driver asked, then died
                last_sweep = time.monotonic()
                if orphans := reclaim_orphans(study):
                    printer(f"        failed trial(s) {orphans}: asked by an explorer process that died")
            timed_out = spec.timeout_s is not None and time.monotonic() - started > spec.timeout_s
            room = len(in_flight) + len(pending) < spec.parallel_trials
            exhausted = reuse_streak >= MAX_REUSE_STREAK
            stop.check()  # nothing starts once a stop signal came (it may come while asking)
            flight = next_to_start(pending, launcher.fits, spec.max_passed_over)
            if flight is not None:
                if not launcher_started:
                    try:
                        launcher.start()
                    except KeyboardInterrupt:  # a stop signal while Ray started: the trial is marked too
                        pending.insert(0, flight)
                        raise
                    launcher_started = True
                fault = pick_fault(
                    spec.faults, trial_number=flight.trial.number, attempt=flight.attempt, launch=launches
                )
                launches += flight.attempt == 0
                if fault is not None:
                    set_user_attrs(flight.trial, {"injected_fault": fault.kind})
                launcher.submit(
                    TrialJob.for_study(loaded, flight.config, trial_number=flight.trial.number, fault=fault)
                )
                in_flight[flight.trial.number] = flight
                injected = f" (injected fault: {fault.kind})" if fault is not None else ""
                printer(f"        trial {flight.trial.number} started: {describe(flight.config)}{injected}")
                continue
            # nothing waiting can start: ask for another while GPUs are free (or nothing waits yet)
            wanted = not pending or (
                len(pending) < spec.lookahead
                and launcher.fits(1)
                and pending[0].passed_over < spec.max_passed_over
            )
            asked = None
            if wanted and room and not (timed_out or exhausted):
                with drivers.turn():  # one driver at a time asks
                    peers = drivers.others()
                    if peers or was_shared:  # count what every driver has done and is doing
                        occupied = occupancy(study, known)
                        done = occupied.counted
                        free = occupied.left(spec.n_trials) > 0
                    else:
                        free = done + len(in_flight) + len(pending) < spec.n_trials
                    was_shared = peers
                    if free:
                        asked = ask_trial(
                            study,
                            loaded,
                            known,
                            local,
                            valid_configs,
                            in_flight,
                            pending,
                            reuse_streak,
                            peers,
                        )
            if asked is not None:
                trial, config, attempt, elsewhere = asked
                source = known.measured.get(config.key())
                if source is not None:
                    status = record_reuse(study, trial, source)
                    reuse_streak = answered(
                        reuse_streak, trial.number, status, config, f"reused trial {source.number}"
                    )
                    continue
                if elsewhere is not None:  # another driver measures it now: wait for that answer
                    remote.append((InFlight(trial, config, attempt), elsewhere))
                    reuse_streak += 1
                    printer(
                        f"        trial {trial.number} waits for trial {elsewhere.number}: same configuration,"
                        " measured by another explorer process"
                    )
                    continue
                busy = next((f for f in [*in_flight.values(), *pending] if f.config == config), None)
                if busy is not None:  # the same configuration is running or waiting: wait for its answer
                    set_user_attrs(trial, {WAITS_FOR: busy.trial.number})
                    twins.setdefault(config.key(), []).append(InFlight(trial, config, attempt))
                    reuse_streak += 1
                    printer(
                        f"        trial {trial.number} waits for trial {busy.trial.number}: same configuration"
                    )
                    continue
                reason = invalid_reason(config, spec.resources)
                if reason is not None:
                    record_outcome(study, trial, Measurement(outcome=Outcome.INVALID, error=reason))
                    done += 1
                    printer(
                        progress_line(
                            done, spec.n_trials, trial.number, "invalid", describe(config), reason, best
                        )
                    )
                    continue
                stored = store.lookup(config_key=config.key(), scope=scope) if store and scope else None
                if stored is not None:  # measured before, by another study or run: counts, as a first answer
                    status = record_from_store(study, trial, stored)
                    known.learn(frozen(study, trial), config)
                    best = better(best, trial.number, stored.measurement)
                    done += 1
                    reuse_streak = 0
                    printer(
                        progress_line(
                            done,
                            spec.n_trials,
                            trial.number,
                            status,
                            describe(config),
                            f"from the store: study {stored.study_name!r} trial {stored.trial_number}",
                            best,
                        )
                    )
                    continue
                proof = inferred_oom(config, known.ooms) if spec.infer_oom else None
                if proof is not None:
                    status = record_inferred_oom(study, trial, proof)
                    reuse_streak = answered(
                        reuse_streak, trial.number, status, config, f"inferred from OOM trial {proof}"
                    )
                    continue
                pending.append(InFlight(trial, config, attempt))
                continue
            if not in_flight and not pending:
                if not remote:
                    break
                time.sleep(0.5)  # only answers of other drivers are awaited
                continue
            for number, measurement in launcher.wait(timeout_s=1.0):
                flight = in_flight.pop(number)
                if journal is not None:
                    write_measurement(journal, spec.name, flight.trial, measurement)
                retry = measurement.outcome is Outcome.FAILED and flight.attempt < spec.launcher.max_retries
                status = record_outcome(study, flight.trial, measurement, retry=retry)
                if status in ("ok", "oom"):
                    known.learn(frozen(study, flight.trial), flight.config)
                    reuse_streak = 0
                    if store is not None and scope is not None:
                        store.put(
                            config_key=flight.config.key(),
                            scope=scope,
                            measurement=measurement,
                            study_name=spec.name,
                            trial_number=number,
                        )
                same = twins.pop(flight.config.key(), [])
                if status in ("ok", "oom"):
                    source = known.measured[flight.config.key()]
                    for twin in same:
                        record_reuse(study, twin.trial, source)
                        printer(f"        trial {twin.trial.number} {status}: reused trial {number}")
                elif same and retry:  # the first proposal of it again runs as the retry
                    same[0].attempt = flight.attempt + 1
                    set_user_attrs(
                        same[0].trial,
                        {
                            "attempt": same[0].attempt,
                            "requeued_from": number,
                            "requeued_why": "failed",
                            WAITS_FOR: None,
                        },
                    )
                    pending.append(same[0])
                    if same[1:]:
                        twins[flight.config.key()] = same[1:]
                else:  # failed for good: so would they (answered so, without counting)
                    for twin in same:
                        fail_as(study, twin, number)
                if retry and not same:
                    requeue(study, frozen(study, flight.trial), attempt=flight.attempt + 1, why="failed")
                elif not retry:
                    done += 1
                best = better(best, number, measurement)
                detail = (
                    f"{measurement.properties.dataset_tokens_per_second_per_gpu:.1f} tok/s/gpu"
                    if measurement.properties is not None
                    else short(measurement.error or "")
                )
                detail += f" ({measurement.wall_seconds:.1f} s)"
                printer(
                    progress_line(done, spec.n_trials, number, status, describe(flight.config), detail, best)
                )
    except KeyboardInterrupt as exc:  # the first signal's flag, a second signal, or a bare Ctrl-C
        signum = stop.stopping(signal_of(exc))  # from now on another signal ends the process at once
        twins_waiting = [t for ts in twins.values() for t in ts] + [f for f, _ in remote]
        abandon(study, [*in_flight.values(), *pending, *twins_waiting])
        with contextlib.suppress(OSError):  # a hung-up terminal (EIO): the trials are marked all the same
            printer(
                "interrupted: in-flight trials are marked interrupted and re-run on resume"
                f" ({signal_name(signum)})"
            )
        raise Interrupted(signum) from None
    finally:
        if owns_launcher and launcher_started:
            launcher.shutdown()
        drivers.leave()
        stop.restore()
    _note_early_stop(study, done=done, n_trials=spec.n_trials, timed_out=timed_out, exhausted=exhausted)
    statuses: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        s = (
            "stored"
            if "reused_from_store" in t.user_attrs
            else "reused"
            if "reused_from" in t.user_attrs
            else "inferred"
            if "inferred_from" in t.user_attrs
            else (status_of(t) or t.state.name.lower())
        )
        statuses[s] = statuses.get(s, 0) + 1
    done = len(counted_trials(study))  # by every driver of the study
    return OptimizeResult(
        study_name=spec.name,
        storage_url=loaded.storage_url,
        counted=done,
        n_trials=spec.n_trials,
        wall_seconds=time.monotonic() - started,
        statuses=statuses,
    )


def _note_early_stop(
    study: optuna.Study, *, done: int, n_trials: int, timed_out: bool, exhausted: bool
) -> None:
    """Record on the study why it ended short of ``n_trials`` (``stopped_early``), or clear it.

    ``explorer audit`` accepts fewer counted trials than ``n_trials`` only with this record: the
    run's ``timeout_s`` ran out, or every configuration the sampler still proposed was answered
    already (a space with fewer answerable configurations left than trials asked for).
    """
    why = None
    if done < n_trials and timed_out:
        why = "timeout_s ran out"
    elif done < n_trials and exhausted:
        why = f"the last {MAX_REUSE_STREAK} proposals were all answered already: nothing new to try"
    if why is not None:
        study.set_user_attr(STOPPED_EARLY, {"counted": done, "why": why})
    elif STOPPED_EARLY in study.user_attrs:
        study.set_user_attr(STOPPED_EARLY, None)
