"""``explorer optimize``: the ask/tell loop that feeds Ray actors and records every outcome at once."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.fault import first_launches, pick_fault
from explorer.job import TrialJob
from explorer.measurement import Measurement, Outcome
from explorer.spec import LoadedStudy
from explorer.study._inference import inferred_oom
from explorer.study._interrupt import StopRequest
from explorer.study._journal import read_ahead
from explorer.study._journal import write_ahead as write_measurement
from explorer.study._known import Known
from explorer.study._neighbours import LocalSearch
from explorer.study._objectives import SECOND_OBJECTIVES, Direction, best_feasible, objective_value
from explorer.study._peers import WAITS_FOR, occupancy, running_elsewhere, settled, shared, turn
from explorer.study._proposals import propose_neighbour, propose_unanswered
from explorer.study._record import (
    OBJECTIVE,
    answered_without_running,
    counted_trials,
    frozen,
    record_driver,
    record_from_store,
    record_inferred_oom,
    record_outcome,
    record_reuse,
    set_user_attrs,
    status_of,
)
from explorer.study._recover import reclaim_interrupted, reclaim_orphans, requeue
from explorer.study._sampler import make_sampler
from explorer.study._storage import mask_url, open_storage
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

if TYPE_CHECKING:
    import optuna

    from explorer.launch import Launcher
    from explorer.progress import ProgressHook

__all__ = ["OptimizeResult", "describe", "open_existing_study", "open_study", "optimize"]

Printer = Callable[[str], None]
MAX_REUSE_STREAK = 30
ORPHAN_SWEEP_S = 10.0
"""How often the loop looks for trials asked by a driver that died before starting them."""
EXPLORE_AFTER = 1
"""With ``when_converged: explore``: after this many proposals in a row answered without running,
the next is an unanswered configuration drawn at random."""
"""Stop asking after this many proposals in a row were all answered without running (already
measured, or inferred OOM): the sampler has nothing new to try."""


@dataclass(frozen=True)
class OptimizeResult:
    study_name: str
    storage_url: str
    counted: int
    n_trials: int
    wall_seconds: float
    statuses: dict[str, int]


@dataclass
class _InFlight:
    trial: optuna.Trial
    config: TrialConfig
    attempt: int
    passed_over: int = 0
    """While it waits for GPUs: times a younger waiting trial started ahead of it."""


def _next_to_start(
    pending: list[_InFlight], fits: Callable[[int, int], bool], max_passed_over: int
) -> _InFlight | None:
    """The waiting trial to start now, taken out of ``pending`` (``None``: none can start).

    First fit, oldest first. When a younger trial starts ahead of the oldest, the oldest is passed
    over once more; once it has been passed over ``max_passed_over`` times it is reserved: nothing
    else starts until it fits (the GPUs drain for it), so a large trial is never starved.
    """
    for i, flight in enumerate(pending):
        if fits(flight.config.number_gpus, flight.config.number_nodes):
            if i > 0:
                pending[0].passed_over += 1
            return pending.pop(i)
        if i == 0 and flight.passed_over >= max_passed_over:
            return None
    return None


def describe(config: TrialConfig) -> str:
    """A short human-readable form of a configuration."""
    backend: str = config.distributed_backend
    if backend == "FSDP":
        backend = f"FSDP{config.fsdp_version}/{config.fsdp_sharding_strategy}"
    parts = [
        f"bs={config.batch_size}",
        f"gpus={config.number_gpus}",
        *([f"nodes={config.number_nodes}"] if config.number_nodes > 1 else []),
        backend if config.number_gpus > 1 else "single",
        f"ckpt={'on' if config.gradient_checkpointing else 'off'}",
        f"len={config.model_max_length}",
    ]
    if config.gradient_accumulation_steps != 1:
        parts.append(f"ga={config.gradient_accumulation_steps}")
    if config.lora_r is not None:
        parts.append(f"lora_r={config.lora_r}")
    if config.torch_compile:
        parts.append("compile")
    return " ".join(parts)


def open_study(
    loaded: LoadedStudy,
    *,
    create: bool,
    sampler: optuna.samplers.BaseSampler | None = None,
    storage: optuna.storages.BaseStorage | None = None,
) -> optuna.Study:
    """The study in its storage; ``create`` makes it if missing (else it must exist).

    Args:
        sampler: instead of the study file's (``benchmark-search`` compares samplers this way).
        storage: instead of the study's URL (``benchmark-search`` replays in memory).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage or open_storage(loaded.storage_url, field_file=str(loaded.file) + ": storage")
    sampler = sampler or make_sampler(loaded.spec.sampler)
    if create:
        names = [OBJECTIVE] + ([second] if (second := loaded.spec.second_objective) else [])
        directions: list[Direction] = ["maximize"]
        if second:
            directions.append(SECOND_OBJECTIVES[second])
        study = optuna.create_study(
            study_name=loaded.spec.name,
            storage=storage,
            sampler=sampler,
            directions=directions,
            load_if_exists=True,
        )
        if [d.name.lower() for d in study.directions] != directions:
            from explorer.errors import SpecError

            raise SpecError(
                file=str(loaded.file),
                field="second_objective",
                problem=f"the stored study {loaded.spec.name!r} has other objectives; use a new name",
            )
        if study.metric_names is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(names)
        return study
    return optuna.load_study(study_name=loaded.spec.name, storage=storage, sampler=sampler)


def open_existing_study(loaded: LoadedStudy) -> optuna.Study:
    """The study, which must exist; a missing sqlite file is not created.

    Raises:
        SpecError: no such study (or database file).
    """
    from pathlib import Path

    from sqlalchemy.engine import make_url

    from explorer.errors import SpecError

    missing = SpecError(
        file=str(loaded.file),
        field="name",
        problem=f"no study {loaded.spec.name!r} in {mask_url(loaded.storage_url)}",
    )
    url = make_url(loaded.storage_url)
    database = url.database or ""
    if (
        url.get_backend_name() == "sqlite"
        and database not in ("", ":memory:")
        and not Path(database).is_file()
    ):
        raise missing
    try:
        return open_study(loaded, create=False)
    except KeyError:  # optuna: "Record does not exist."
        raise missing from None


def _enqueue_grid(study: optuna.Study, loaded: LoadedStudy) -> int:
    """For ``sampler: grid``: enqueue every valid configuration not yet in the study."""
    seen = {t.user_attrs.get("config_key") for t in study.get_trials(deepcopy=False)}
    n = 0
    for config in loaded.space.enumerate():
        if config.key() in seen or invalid_reason(config, loaded.spec.resources):
            continue
        study.enqueue_trial(loaded.space.params_for(config), skip_if_exists=True)
        n += 1
    return n


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
    storage = storage or open_storage(loaded.storage_url, field_file=str(loaded.file) + ": storage")
    study = open_study(loaded, create=True, sampler=sampler, storage=storage)
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
        added = _enqueue_grid(study, loaded)
        if added:
            printer(f"grid: enqueued {added} configurations")
    done = len(counted_trials(study))
    printer(f"study {spec.name!r} in {mask_url(loaded.storage_url)}: {done}/{spec.n_trials} trials done")
    owns_launcher = launcher is None
    if launcher is None:
        launcher = launcher_for(loaded, output_dir=loaded.output_dir)
    in_flight: dict[int, _InFlight] = {}
    twins: dict[str, list[_InFlight]] = {}  # proposals of a configuration already in flight or pending
    remote: list[tuple[_InFlight, optuna.trial.FrozenTrial]] = []  # waiting for another driver's trial
    pending: list[_InFlight] = []  # asked, valid, waiting for GPUs to free up; oldest first
    best: tuple[float, int] | None = _best(study)
    known = Known.from_study(study)
    valid_configs: list[TrialConfig] = []  # for when_converged: explore, filled on first use
    local = (
        LocalSearch(space=loaded.space, resources=spec.resources)
        if spec.sampler.local_search and spec.sampler.kind in ("tpe", "gp")
        else None
    )
    reuse_streak = 0
    launcher_started = False
    last_sweep = time.monotonic()
    peers = shared(study)  # PostgreSQL: other drivers may run this study too
    launches = first_launches(study) if spec.faults is not None else 0  # first attempts launched so far

    def answered(streak: int, number: int, status: str, config: TrialConfig, why: str) -> int:
        """Print a proposal answered without running (reused or inferred); returns the new streak."""
        printer(_line(done, spec.n_trials, number, status, describe(config), why, best))
        if streak + 1 == MAX_REUSE_STREAK:
            printer(f"stopping: the last {MAX_REUSE_STREAK} proposals were all answered already")
        return streak + 1

    stop = StopRequest().__enter__()  # Ctrl-C: a flag checked each time round
    try:
        while True:
            if stop.requested:
                raise KeyboardInterrupt
            if remote:
                _settle_remote(study, remote, pending, known, printer)
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
            flight = _next_to_start(pending, launcher.fits, spec.max_passed_over)
            if flight is not None:
                if not launcher_started:
                    launcher.start()
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
                with turn(study):  # one driver at a time asks (PostgreSQL: other drivers may share the study)
                    if peers:  # count what every driver has done and is doing
                        occupied = occupancy(study, known)
                        done = occupied.counted
                        free = occupied.left(spec.n_trials) > 0
                    else:
                        free = done + len(in_flight) + len(pending) < spec.n_trials
                    if free:
                        asked = _ask(
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
                    remote.append((_InFlight(trial, config, attempt), elsewhere))
                    reuse_streak += 1
                    printer(
                        f"        trial {trial.number} waits for trial {elsewhere.number}: same configuration,"
                        " measured by another explorer process"
                    )
                    continue
                busy = next((f for f in [*in_flight.values(), *pending] if f.config == config), None)
                if busy is not None:  # the same configuration is running or waiting: wait for its answer
                    set_user_attrs(trial, {WAITS_FOR: busy.trial.number})
                    twins.setdefault(config.key(), []).append(_InFlight(trial, config, attempt))
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
                        _line(done, spec.n_trials, trial.number, "invalid", describe(config), reason, best)
                    )
                    continue
                stored = store.lookup(config_key=config.key(), scope=scope) if store and scope else None
                if stored is not None:  # measured before, by another study or run: counts, as a first answer
                    status = record_from_store(study, trial, stored)
                    known.learn(frozen(study, trial), config)
                    best = _better(best, trial.number, stored.measurement)
                    done += 1
                    reuse_streak = 0
                    printer(
                        _line(
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
                pending.append(_InFlight(trial, config, attempt))
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
                        _fail_as(study, twin, number)
                if retry and not same:
                    requeue(study, frozen(study, flight.trial), attempt=flight.attempt + 1, why="failed")
                elif not retry:
                    done += 1
                best = _better(best, number, measurement)
                detail = (
                    f"{measurement.properties.dataset_tokens_per_second_per_gpu:.1f} tok/s/gpu"
                    if measurement.properties is not None
                    else _short(measurement.error or "")
                )
                detail += f" ({measurement.wall_seconds:.1f} s)"
                printer(_line(done, spec.n_trials, number, status, describe(flight.config), detail, best))
    except KeyboardInterrupt:
        printer("interrupted: in-flight trials are marked interrupted and re-run on resume")
        twins_waiting = [t for ts in twins.values() for t in ts] + [f for f, _ in remote]
        _abandon(study, [*in_flight.values(), *pending, *twins_waiting])
        raise
    finally:
        if owns_launcher and launcher_started:
            launcher.shutdown()
        stop.__exit__(None, None, None)
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


def _ask(
    study: optuna.Study,
    loaded: LoadedStudy,
    known: Known,
    local: LocalSearch | None,
    valid_configs: list[TrialConfig],
    in_flight: dict[int, _InFlight],
    pending: list[_InFlight],
    reuse_streak: int,
    peers: bool,
) -> tuple[optuna.Trial, TrialConfig, int, optuna.trial.FrozenTrial | None]:
    """Propose, ask and tag a trial (in the driver's turn); returns it, its configuration, its
    attempt, and the trial of another driver measuring that configuration right now, if any (the
    new trial is then tagged as waiting for it)."""
    spec = loaded.spec
    waiting = [*in_flight.values(), *pending]
    if spec.when_converged == "explore" and reuse_streak >= EXPLORE_AFTER:
        propose_unanswered(study, loaded, known, (f.config for f in waiting), valid_configs)
    elif local is not None:
        propose_neighbour(study, loaded, local, known, (f.config for f in waiting))
    trial = study.ask()
    config = loaded.space.suggest(trial)
    attempt = int(trial.user_attrs.get("attempt", 0))
    record_driver(trial, config, attempt)
    elsewhere = running_elsewhere(study, known, config.key()) if peers else None
    if elsewhere is not None and config.key() not in known.measured:
        set_user_attrs(trial, {WAITS_FOR: elsewhere.number})
        return trial, config, attempt, elsewhere
    return trial, config, attempt, None


def _settle_remote(
    study: optuna.Study,
    remote: list[tuple[_InFlight, optuna.trial.FrozenTrial]],
    pending: list[_InFlight],
    known: Known,
    printer: Printer,
) -> None:
    """Answer the trials waiting for another driver's trial that has ended: reused from its
    measurement (ok, oom), failed like it (failed for good), or else (retried, interrupted, its
    driver died) run here."""
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
            _fail_as(study, flight, now.number)
        else:
            set_user_attrs(flight.trial, {WAITS_FOR: None})
            pending.append(flight)


def _fail_as(study: optuna.Study, twin: _InFlight, number: int) -> None:
    """Finish ``twin`` as failed, like trial ``number`` of the same configuration (not counted)."""
    import optuna

    set_user_attrs(
        twin.trial,
        {
            "status": "failed",
            "reused_from": number,
            "wall_seconds": 0.0,
            "error": f"same configuration as trial {number}, which failed (retries exhausted)",
        },
    )
    study.tell(twin.trial, state=optuna.trial.TrialState.FAIL)


def _abandon(study: optuna.Study, flights: list[_InFlight]) -> None:
    import optuna

    for flight in flights:
        flight.trial.set_user_attr("status", "interrupted")
        flight.trial.set_user_attr("error", "explorer was interrupted; re-run on resume")
        study.tell(flight.trial, state=optuna.trial.TrialState.FAIL)
        requeue(study, frozen(study, flight.trial), attempt=flight.attempt, why="interrupted")


def _short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _better(
    best: tuple[float, int] | None, number: int, measurement: Measurement
) -> tuple[float, int] | None:
    """``best`` updated with trial ``number``'s measurement."""
    if measurement.outcome is not Outcome.OK or measurement.properties is None:
        return best
    value = measurement.properties.dataset_tokens_per_second_per_gpu
    return (value, number) if best is None or value > best[0] else best


def _best(study: optuna.Study) -> tuple[float, int] | None:
    t = best_feasible(study)
    value = objective_value(t) if t is not None else None
    return (value, t.number) if t is not None and value is not None else None


def _line(
    done: int, total: int, number: int, status: str, config: str, detail: str, best: tuple[float, int] | None
) -> str:
    best_txt = f"best {best[0]:.1f} (trial {best[1]})" if best else "best -"
    return f"[{done:>3}/{total}] trial {number:<4} {status:<8} {config:<48} {detail} | {best_txt}"
