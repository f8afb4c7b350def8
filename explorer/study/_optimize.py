"""``explorer optimize``: the ask/tell loop that feeds Ray actors and records every outcome at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.record import StudyKey, StudyRecord, TrialRecord, write_study
from explorer.search._strategy import make_strategy
from explorer.secrets import mask_url
from explorer.spec import LoadedStudy
from explorer.study._audit import RUN_N_TRIALS
from explorer.study._identity import refuse_other_job
from explorer.study._journal import read_ahead
from explorer.study._lines import describe, short
from explorer.study._loop import MAX_REUSE_STREAK, Loop
from explorer.study._notes import describe_study
from explorer.study._objectives import PER_GPU_RANKED
from explorer.study._open import enqueue_grid, open_existing_study, open_study
from explorer.study._peers import Drivers
from explorer.study._record import counted_trials, status_of
from explorer.study._recover import reclaim_interrupted
from explorer.study._run_folder import check_run_folder, check_writable, claim_run_folder
from explorer.study._shrunk import check_space_holds_trials
from explorer.study._storage import open_storage
from explorer.validity import attach_findings, nothing_runs

if TYPE_CHECKING:
    import optuna

    from explorer.launch import Launcher
    from explorer.progress import ProgressHook
    from explorer.search import Strategy
    from explorer.spec import StudySpec

__all__ = ["OptimizeResult", "describe", "open_existing_study", "open_study", "optimize"]

Printer = Callable[[str], None]
STOPPED_EARLY = StudyKey.STOPPED_EARLY
"""Study record key: why the last run ended short of ``n_trials`` (``None``: it did not)."""


@dataclass(frozen=True)
class OptimizeResult:
    study_name: str
    storage_url: str
    counted: int
    n_trials: int
    wall_seconds: float
    statuses: dict[str, int]
    measured_nothing: str | None = None
    """Set when every trial this run ended failed (a crash, not an OOM): the common cause, one line
    (:func:`measured_nothing`); the CLI then exits non-zero."""


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
        sampler: instead of the strategy's (``sampler.strategy``; the study file's ``kind`` for most).
        storage: instead of the study's URL.
        progress: told the loop's state each time round (the CLI's live footer on a terminal).
        write_ahead: write each finished trial's measurement under ``output_dir`` before it is
            recorded, and recover such files on resume (:mod:`explorer.study._journal`);
            ``False`` for throw-away in-memory studies (``benchmark-search``).
    """
    from optuna.storages import RDBStorage

    from explorer.launch import launcher_for
    from explorer.store import MeasurementStore, StoreScope

    spec = loaded.spec
    started = time.monotonic()
    owns_storage = storage is None
    strategy = make_strategy(loaded.space, spec, per_gpu_ranked=spec.objective in PER_GPU_RANKED)
    loaded, study, storage, drivers = _open_run(
        loaded, sampler=sampler or strategy.sampler(), storage=storage, write_ahead=write_ahead
    )
    try:
        _refuse_if_nothing_runs(loaded, study)
        _price_search(strategy, study, spec, printer)
        store = MeasurementStore.for_storage(storage) if spec.reuse_measurements else None
        scope = StoreScope.for_study(loaded) if store is not None else None
        journal = loaded.output_dir if write_ahead else None
        done = _resume(loaded, study, storage, journal=journal, reclaim_all=reclaim_all, printer=printer)
        owns_launcher = launcher is None
        if launcher is None:
            launcher = launcher_for(loaded, output_dir=loaded.output_dir)
        loop = Loop(
            loaded,
            study,
            drivers=drivers,
            launcher=launcher,
            strategy=strategy,
            owns_launcher=owns_launcher,
            printer=printer,
            progress=progress,
            store=store,
            scope=scope,
            journal=journal,
            started=started,
            done=done,
        )
        loop.run()
        _note_early_stop(
            study, done=loop.done, n_trials=spec.n_trials, timed_out=loop.timed_out, exhausted=loop.exhausted
        )
        statuses = _statuses(study)
        done = len(counted_trials(study))  # by every driver of the study
        return OptimizeResult(
            study_name=spec.name,
            storage_url=loaded.storage_url,
            counted=done,
            n_trials=spec.n_trials,
            wall_seconds=time.monotonic() - started,
            statuses=statuses,
            measured_nothing=measured_nothing(study.get_trials(deepcopy=False)),
        )

    finally:
        if owns_storage and isinstance(storage, RDBStorage):
            # close its connections now, not whenever they are collected: the last one to close
            # folds sqlite's WAL into the file, which must not happen during a later command
            # that promises to write nothing (a refused optimize, a read-only verb)
            storage.engine.dispose()


def measured_nothing(trials: list[optuna.trial.FrozenTrial]) -> str | None:
    """Why this run measured nothing, when every one of ``trials`` that this process asked and
    ended failed (status ``failed`` or ``retry``: a crash, a timeout, an unloadable model; an OOM
    or an answer without running is a result): ``"... N trial(s) all failed; the common cause (K
    of N): ERROR"``. ``None`` when any of them is a result, or none ended here."""
    import os

    import psutil

    me = {"pid": os.getpid(), "start": psutil.Process().create_time()}  # as record_driver tags them
    ours = [t for t in trials if {k: (TrialRecord.of(t).driver or {}).get(k) for k in me} == me]
    ended = [t for t in ours if status_of(t) is not None]
    if not ended or any(status_of(t) not in ("failed", "retry") for t in ended):
        return None
    causes: dict[str, int] = {}
    for t in ended:
        cause = short(TrialRecord.of(t).error or "no error recorded", 160)
        causes[cause] = causes.get(cause, 0) + 1
    cause, n = max(causes.items(), key=lambda item: item[1])
    return f"this run measured nothing: its {len(ended)} trial(s) all failed; the common cause ({n} of {len(ended)}): {cause}"


def _open_run(
    loaded: LoadedStudy,
    *,
    sampler: optuna.samplers.BaseSampler | None,
    storage: optuna.storages.BaseStorage | None,
    write_ahead: bool,
) -> tuple[LoadedStudy, optuna.Study, optuna.storages.BaseStorage, Drivers]:
    """Open (or create) the study, join its drivers, and claim its run folder where files are
    kept; returns the study file (its run folder as claimed), the study, its storage and drivers."""
    owned = write_ahead and loaded.storage_url not in ("sqlite://", "sqlite:///:memory:")  # kept files
    if owned:  # another storage's study owns the folder, or it is read-only: refused before writing
        check_run_folder(loaded)
        check_writable(loaded)
    if storage is None:  # another job under this name: refused before anything is written too
        refuse_other_job(loaded)
    storage = storage or open_storage(loaded.storage_url, field_file=str(loaded.file) + ": storage")
    study = open_study(loaded, create=True, sampler=sampler, storage=storage)
    check_space_holds_trials(study, loaded)  # a space shrunk after trials ran: refused, nothing written
    drivers = Drivers.join(study)  # other drivers of this study: take turns, count what they do
    with drivers.turn():
        if owned:  # a throw-away study in memory claims no folder
            loaded = claim_run_folder(study, loaded)
        describe_study(study, loaded)  # what the dashboard shows of the workload and hardware
        # what audit holds it to: never fewer than already count (a plain run after --n-trials 5)
        n_trials = max(loaded.spec.n_trials, len(counted_trials(study)))
        if StudyRecord.of(study).n_trials != n_trials:
            write_study(study, RUN_N_TRIALS, n_trials)
    return loaded, study, storage, drivers


def _refuse_if_nothing_runs(loaded: LoadedStudy, study: optuna.Study) -> None:
    """Refuse (one line, exit 2) a study where no configuration may run, ``explorer doctor``'s
    findings attached: the search would have nothing to propose."""
    from explorer.errors import SpecError

    attach_findings(loaded.spec.resources, StudyRecord.of(study).doctor)
    problem = nothing_runs(loaded.space, loaded.spec.resources)
    if problem is not None:
        raise SpecError(file=str(loaded.file), field="search_space", problem=problem)


def _price_search(strategy: Strategy, study: optuna.Study, spec: StudySpec, printer: Printer) -> None:
    """Price the strategy's physics with the figures ``explorer doctor`` recorded on the study (the
    table's where it recorded none), and say so when it uses measured ones."""
    from explorer.gpus import describe_measured, study_figures

    node = StudyRecord.of(study).measured_node(spec.resources.model)
    figures = study_figures(spec.resources, node)
    if strategy.price_with(figures) and node and figures is not None:
        printer(f"search: the physics priced at {describe_measured(figures, node)}")


def _resume(
    loaded: LoadedStudy,
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    *,
    journal: Path | None,
    reclaim_all: bool,
    printer: Printer,
) -> int:
    """Reclaim the trials of dead drivers, enqueue a grid, and print where the study stands;
    returns the trials counted so far."""
    spec = loaded.spec
    reclaimed = reclaim_interrupted(
        study,
        force=reclaim_all,
        recover=(lambda t: read_ahead(journal, spec.name, t)) if journal is not None else None,
        max_retries=spec.launcher.max_retries,
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
    return done


def _statuses(study: optuna.Study) -> dict[str, int]:
    """How many trials of the study ended which way (reused, stored and inferred apart)."""
    statuses: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        r = TrialRecord.of(t)
        s = (
            "stored"
            if r.reused_from_store is not None
            else "reused"
            if r.reused_from is not None
            else "inferred"
            if r.inferred_from is not None
            else (r.status or t.state.name.lower())
        )
        statuses[s] = statuses.get(s, 0) + 1
    return statuses


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
        write_study(study, STOPPED_EARLY, {"counted": done, "why": why})
    elif StudyRecord.of(study).has(STOPPED_EARLY):
        write_study(study, STOPPED_EARLY, None)
