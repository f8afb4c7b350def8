"""The optimize loop's steps: start a waiting trial, ask for a proposal in the driver's turn, answer
it without running where it can be answered, settle finished trials, and mark everything still
open on a stop signal. :class:`Loop` holds the state the steps share."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from explorer.fault import first_launches, pick_fault
from explorer.job import TrialJob
from explorer.measurement import Measurement, Outcome
from explorer.record import Key, StudyRecord, write
from explorer.search._inference import inferred_oom
from explorer.search._strategy import Strategy
from explorer.spec import LoadedStudy
from explorer.study._confirm import confirm, imprecise_line
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
from explorer.study._peers import (
    HEARTBEAT_S,
    WAITS_FOR,
    Drivers,
    beat,
    claim,
    dead_running,
    occupancy,
    stale_trials,
)
from explorer.study._record import (
    frozen,
    record_from_store,
    record_inferred_oom,
    record_outcome,
    record_reuse,
)
from explorer.study._recover import close_surplus, reclaim_interrupted, reclaim_orphans, requeue
from explorer.trial_config import TrialConfig
from explorer.validity import attach_findings, invalid_reason

if TYPE_CHECKING:
    import optuna

    from explorer.launch import Launcher
    from explorer.progress import ProgressHook
    from explorer.store import MeasurementStore, StoreScope

    Asked = tuple[optuna.Trial, TrialConfig, int, optuna.trial.FrozenTrial | None]
    """A new trial, its configuration, its attempt, and the trial of another driver measuring that
    configuration right now (:func:`explorer.study._flight.ask_trial`)."""

__all__ = ["MAX_REUSE_STREAK", "ORPHAN_SWEEP_S", "Loop"]

Printer = Callable[[str], None]
MAX_REUSE_STREAK = 30
"""Stop asking after this many proposals in a row were all answered without running (already
measured, or inferred OOM): the sampler has nothing new to try."""
ORPHAN_SWEEP_S = 10.0
"""How often the loop looks for trials asked by a driver that died before starting them."""


def _full_temp_folder() -> str | None:
    """Why Ray could not start when its temporary folder (``RAY_TMPDIR``, else the system's) has
    less than 64 MiB free; ``None`` otherwise."""
    import shutil
    import tempfile

    folder = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return f"Ray's temporary folder {folder} has {free // 1024} KiB free" if free < 64 << 20 else None


class Loop:
    """One run of the ask/tell loop over an opened study: :meth:`run` goes round until ``n_trials``
    count, nothing new is left to try, or ``timeout_s`` runs out; ``done``, ``timed_out`` and
    ``exhausted`` say how it ended."""

    def __init__(
        self,
        loaded: LoadedStudy,
        study: optuna.Study,
        *,
        drivers: Drivers,
        launcher: Launcher,
        strategy: Strategy,
        owns_launcher: bool,
        printer: Printer,
        progress: ProgressHook | None,
        store: MeasurementStore | None,
        scope: StoreScope | None,
        journal: Path | None,
        started: float,
        done: int,
    ) -> None:
        spec = loaded.spec
        attach_findings(spec.resources, StudyRecord.of(study).doctor)  # explorer doctor's: invalid
        self.loaded, self.spec, self.study, self.drivers = loaded, spec, study, drivers
        self.launcher, self.owns_launcher = launcher, owns_launcher
        self.printer, self.progress = printer, progress
        self.store, self.scope, self.journal = store, scope, journal
        self.started, self.done = started, done
        self.in_flight: dict[int, InFlight] = {}
        # proposals of a configuration already in flight or pending
        self.twins: dict[str, list[InFlight]] = {}
        # waiting for another driver's trial
        self.remote: list[tuple[InFlight, optuna.trial.FrozenTrial]] = []
        self.pending: list[InFlight] = []  # asked, valid, waiting for GPUs to free up; oldest first
        self.best: tuple[float, int] | None = stored_best(study)
        self.known = Known.from_study(study)
        self.strategy = strategy  # what to run next (sampler.strategy), asked before the sampler
        self.reuse_streak = 0
        self.launcher_started = False
        self.timed_out = self.exhausted = False
        self.last_sweep = self.last_beat = time.monotonic()
        self.was_shared = False  # other drivers at work at the last ask
        # first attempts launched so far
        self.launches = first_launches(study) if spec.faults is not None else 0
        self.measured = 0  # trials this run measured
        self.imprecise: list[float] = []  # their step-time CIs that missed measurement.target_rel_ci

    def run(self) -> None:
        """Go round until nothing is left to do; on a stop signal mark every open trial interrupted
        and raise :class:`Interrupted`."""
        stop = StopRequest().install()  # SIGINT, SIGTERM, SIGHUP: a flag checked each time round
        try:
            while self._round(stop):
                pass
            self._reclaim_peers()  # a dead driver's trials are not left RUNNING when this run ends
            with self.drivers.turn():
                if surplus := close_surplus(self.study, self.spec.n_trials):
                    self.printer(f"        re-run(s) {surplus} not needed: {self.spec.n_trials} trials count")
            if line := imprecise_line(self.loaded, self.imprecise, self.measured):
                self.printer(line)
            if not self.timed_out and not self.drivers.others():  # the last driver confirms
                confirm(
                    self.study,
                    self.spec,
                    lambda config, job: self._measure_again(stop, config, job),
                    self.printer,
                )
        except KeyboardInterrupt as exc:  # the first signal's flag, a second signal, or a bare Ctrl-C
            self._interrupted(stop, exc)
        except Exception as exc:  # anything else (a full disk, Ray gone, the storage): the same marks
            self._failed(exc)
            raise
        finally:
            if self.owns_launcher and self.launcher_started:
                self.launcher.shutdown()
            self.drivers.leave()
            stop.restore()

    def _round(self, stop: StopRequest) -> bool:
        """One time round the loop: start a waiting trial, or else ask for one and answer it, or else
        wait for finished trials and settle them. ``False``: nothing is left to do."""
        spec = self.spec
        stop.check()  # a stop signal came: raises Interrupted
        self._look_around()
        self.timed_out = spec.timeout_s is not None and time.monotonic() - self.started > spec.timeout_s
        room = len(self.in_flight) + len(self.pending) < spec.parallel_trials
        self.exhausted = self.reuse_streak >= MAX_REUSE_STREAK
        stop.check()  # nothing starts once a stop signal came (it may come while asking)
        flight = next_to_start(self.pending, self.launcher.fits, spec.max_passed_over)
        if flight is not None:
            self._start(flight)
            return True
        asked = self._ask(room)
        if asked is not None:
            self._answer(*asked)
            return True
        if not self.in_flight and not self.pending:
            if not self.remote:
                return False
            time.sleep(0.5)  # only answers of other drivers are awaited
            return True
        for number, measurement in self.launcher.wait(timeout_s=1.0):
            self._settle(number, measurement)
        return True

    def _look_around(self) -> None:
        """Answers of other drivers, the progress footer, and trials another driver asked, then died."""
        if self.remote:
            if any(dead_running(self.study, source) for _, source in self.remote):
                self._reclaim_peers()  # its measurement may be on disk: recorded, then reused, not re-run
            settle_remote(self.study, self.remote, self._rerun, self.known, self.printer, self.drivers.turn)
        if self.progress is not None:
            self.progress.update(
                done=self.done,
                total=self.spec.n_trials,
                running=len(self.in_flight),
                queued=len(self.pending),
                best=self.best,
            )
        if time.monotonic() - self.last_beat > HEARTBEAT_S:  # this driver's trials are alive
            self.last_beat = time.monotonic()
            beat(self.study, [f.trial._trial_id for f in self._open_trials()])
        if time.monotonic() - self.last_sweep > ORPHAN_SWEEP_S:  # trials another driver asked, then died
            self.last_sweep = time.monotonic()
            if orphans := reclaim_orphans(self.study, self.drivers.turn):
                self.printer(f"        failed trial(s) {orphans}: asked by an explorer process that died")
            self._reclaim_peers()  # a dead peer holds no lock: it cannot be told from no peer

    def _reclaim_peers(self) -> None:
        """The RUNNING trials of another driver that died (gone from this host, or its heartbeat
        stopped): recovered from its measurement on disk, else failed and re-enqueued, as a
        resume does; this driver runs them in turn (re-enqueued trials are asked first)."""
        journal, name = self.journal, self.spec.name
        with self.drivers.turn():
            found = reclaim_interrupted(
                self.study,
                recover=(lambda t: read_ahead(journal, name, t)) if journal is not None else None,
                stale=stale_trials(self.study),
                live=True,
                max_retries=self.spec.launcher.max_retries,
            )
        if found.recovered or found.requeued:  # the next ask counts them and learns their measurements
            self.was_shared = True
        if found.recovered:
            self.printer(f"        recorded trial(s) {found.recovered} of a dead explorer process from disk")
        if found.requeued:
            self.printer(f"        re-enqueued trial(s) {found.requeued} of an explorer process that died")

    def _rerun(self, flight: InFlight) -> None:
        """A trial that waited for another driver's answer, which never came (that driver died,
        or its attempt failed and is retried): measured meanwhile, or the same configuration is
        already waiting here (both waited on the dead peer, not on each other), else run."""
        trial, config, attempt = flight.trial, flight.config, flight.attempt
        if not (self._reused(trial, config) or self._waits_for_twin(trial, config, attempt)):
            self.pending.append(flight)

    def _start(self, flight: InFlight) -> None:
        """Launch a waiting trial (starting the launcher first, once), with its injected fault if any."""
        spec = self.spec
        if not self.launcher_started:
            try:
                self.launcher.start()
            except BaseException as exc:  # a stop signal, or Ray failing to start: the trial is marked too
                self.pending.insert(0, flight)
                if isinstance(exc, Exception) and (full := _full_temp_folder()) is not None:
                    exc.add_note(full)  # Ray's own error names a file it waited for, not the disk
                raise
            self.launcher_started = True
        fault = pick_fault(
            spec.faults, trial_number=flight.trial.number, attempt=flight.attempt, launch=self.launches
        )
        self.launches += flight.attempt == 0
        if fault is not None:
            write(flight.trial, {Key.INJECTED_FAULT: fault.kind})
        self.launcher.submit(
            TrialJob.for_study(self.loaded, flight.config, trial_number=flight.trial.number, fault=fault)
        )
        self.in_flight[flight.trial.number] = flight
        injected = f" (injected fault: {fault.kind})" if fault is not None else ""
        self.printer(f"        trial {flight.trial.number} started: {describe(flight.config)}{injected}")

    def _ask(self, room: bool) -> Asked | None:
        """A new proposal, asked in this driver's turn, if one is wanted and trials are left to ask."""
        spec, pending = self.spec, self.pending
        # nothing waiting can start: ask for another while GPUs are free (or nothing waits yet)
        wanted = not pending or (
            len(pending) < spec.lookahead
            and self.launcher.fits(1)
            and pending[0].passed_over < spec.max_passed_over
        )
        if not (wanted and room and not (self.timed_out or self.exhausted)):
            return None
        with self.drivers.turn():  # one driver at a time asks
            peers = self.drivers.others()
            if peers or self.was_shared:  # count what every driver has done and is doing
                occupied = occupancy(self.study, self.known)
                self.done = occupied.counted
                free = occupied.left(spec.n_trials) > 0
            else:
                free = self.done + len(self.in_flight) + len(pending) < spec.n_trials
            self.was_shared = peers
            if not free:
                return None
            return ask_trial(
                self.study,
                self.loaded,
                self.known,
                self.strategy,
                self.in_flight,
                pending,
                self.reuse_streak,
                peers,
            )

    def _answer(
        self,
        trial: optuna.Trial,
        config: TrialConfig,
        attempt: int,
        elsewhere: optuna.trial.FrozenTrial | None,
    ) -> None:
        """Answer a new proposal without running it where possible (first that applies), else
        queue it for launch."""
        if not (
            self._reused(trial, config)
            or self._waits_for_peer(trial, config, attempt, elsewhere)
            or self._waits_for_twin(trial, config, attempt)
            or self._invalid(trial, config)
            or self._from_store(trial, config)
            or self._inferred(trial, config)
        ):
            self.pending.append(InFlight(trial, config, attempt))

    def _answered(self, number: int, status: str, config: TrialConfig, why: str) -> None:
        """Print a proposal answered without running (reused or inferred); one more in the streak."""
        self.printer(
            progress_line(self.done, self.spec.n_trials, number, status, describe(config), why, self.best)
        )
        if self.reuse_streak + 1 == MAX_REUSE_STREAK:
            self.printer(f"stopping: the last {MAX_REUSE_STREAK} proposals were all answered already")
        self.reuse_streak += 1

    def _reused(self, trial: optuna.Trial, config: TrialConfig) -> bool:
        """Measured already by a trial of this study: its answer is reused."""
        source = self.known.measured.get(config.key())
        if source is None:
            return False
        status = record_reuse(self.study, trial, source)
        self._answered(trial.number, status, config, f"reused trial {source.number}")
        return True

    def _waits_for_peer(
        self,
        trial: optuna.Trial,
        config: TrialConfig,
        attempt: int,
        elsewhere: optuna.trial.FrozenTrial | None,
    ) -> bool:
        """Another driver measures it now: wait for that answer."""
        if elsewhere is None:
            return False
        self.remote.append((InFlight(trial, config, attempt), elsewhere))
        self.reuse_streak += 1
        self.printer(
            f"        trial {trial.number} waits for trial {elsewhere.number}: same configuration,"
            " measured by another explorer process"
        )
        return True

    def _waits_for_twin(self, trial: optuna.Trial, config: TrialConfig, attempt: int) -> bool:
        """The same configuration is running or waiting here: wait for its answer."""
        busy = next((f for f in [*self.in_flight.values(), *self.pending] if f.config == config), None)
        if busy is None:
            return False
        write(trial, {WAITS_FOR: busy.trial.number})
        self.twins.setdefault(config.key(), []).append(InFlight(trial, config, attempt))
        self.reuse_streak += 1
        self.printer(f"        trial {trial.number} waits for trial {busy.trial.number}: same configuration")
        return True

    def _invalid(self, trial: optuna.Trial, config: TrialConfig) -> bool:
        """Invalid on the study's resources: recorded so without running (counts)."""
        reason = invalid_reason(config, self.spec.resources)
        if reason is None:
            return False
        record_outcome(self.study, trial, Measurement(outcome=Outcome.INVALID, error=reason))
        self.done += 1
        self.printer(
            progress_line(
                self.done, self.spec.n_trials, trial.number, "invalid", describe(config), reason, self.best
            )
        )
        return True

    def _from_store(self, trial: optuna.Trial, config: TrialConfig) -> bool:
        """Measured before, by another study or run: counts, as a first answer."""
        store, scope = self.store, self.scope
        stored = store.lookup(config_key=config.key(), scope=scope) if store and scope else None
        if stored is None:
            return False
        status = record_from_store(self.study, trial, stored)
        self.known.learn(frozen(self.study, trial), config)
        self.best = better(self.best, trial.number, stored.measurement)
        self.done += 1
        self.reuse_streak = 0
        self.printer(
            progress_line(
                self.done,
                self.spec.n_trials,
                trial.number,
                status,
                describe(config),
                f"from the store: study {stored.study_name!r} trial {stored.trial_number}",
                self.best,
            )
        )
        return True

    def _inferred(self, trial: optuna.Trial, config: TrialConfig) -> bool:
        """A smaller configuration ran out of memory: inferred OOM, without running."""
        infer = self.spec.infer_oom and self.strategy.infers_oom
        proof = inferred_oom(config, self.known.ooms) if infer else None
        if proof is None:
            return False
        status = record_inferred_oom(self.study, trial, proof)
        self._answered(trial.number, status, config, f"inferred from OOM trial {proof}")
        return True

    def _settle(self, number: int, measurement: Measurement) -> None:
        """Record a finished trial (its measurement written ahead first), answer its twins, queue
        its retry, and print it."""
        spec = self.spec
        flight = self.in_flight[number]
        if self.journal is not None:  # a full disk raises here: the trial is still marked interrupted
            write_measurement(self.journal, spec.name, flight.trial, measurement)
        del self.in_flight[number]
        retry = measurement.outcome is Outcome.FAILED and flight.attempt < spec.launcher.max_retries
        status = record_outcome(self.study, flight.trial, measurement, retry=retry)
        if status in ("ok", "oom"):
            self._learn(flight, number, measurement)
        elif status == "failed":
            self.known.failed.add(flight.config.key())
        same = self.twins.pop(flight.config.key(), [])
        self._settle_twins(flight, number, status, retry, same)
        if retry and not same:
            requeue(self.study, frozen(self.study, flight.trial), attempt=flight.attempt + 1, why="failed")
        elif not retry:
            self.done += 1
        self.best = better(self.best, number, measurement)
        detail = (
            f"{measurement.properties.dataset_tokens_per_second_per_gpu:.1f} tok/s/gpu"
            if measurement.properties is not None
            else short(measurement.error or "")
        )
        detail += f" ({measurement.wall_seconds:.1f} s)"
        ci = measurement.properties.step_time_rel_ci if measurement.properties else None
        self.measured += measurement.properties is not None
        if ci is not None and ci > spec.measurement.target_rel_ci:  # one line at the end says what to do
            self.imprecise.append(ci)
            detail += f"; CI +-{100 * ci:.1f}%"
        self.printer(
            progress_line(
                self.done, spec.n_trials, number, status, describe(flight.config), detail, self.best
            )
        )

    def _measure_again(self, stop: StopRequest, config: TrialConfig, job: int) -> Measurement:
        """Measure ``config`` once more as launcher job ``job`` (a confirmation, not a trial)."""
        if not self.launcher_started:
            self.launcher.start()
            self.launcher_started = True
        self.launcher.submit(TrialJob.for_study(self.loaded, config, trial_number=job))
        while True:
            stop.check()
            for number, measurement in self.launcher.wait(timeout_s=1.0):
                if number == job:
                    return measurement

    def _learn(self, flight: InFlight, number: int, measurement: Measurement) -> None:
        """A measured answer (ok, oom): known from now on, and put in the measurement store."""
        self.known.learn(frozen(self.study, flight.trial), flight.config)
        self.reuse_streak = 0
        if self.store is not None and self.scope is not None:
            self.store.put(
                config_key=flight.config.key(),
                scope=self.scope,
                measurement=measurement,
                study_name=self.spec.name,
                trial_number=number,
            )

    def _settle_twins(
        self, flight: InFlight, number: int, status: str, retry: bool, same: list[InFlight]
    ) -> None:
        """Answer the proposals that waited for ``flight``'s configuration."""
        if status in ("ok", "oom"):
            source = self.known.measured[flight.config.key()]
            for twin in same:
                record_reuse(self.study, twin.trial, source)
                self.printer(f"        trial {twin.trial.number} {status}: reused trial {number}")
        elif same and retry:  # the first proposal of it again runs as the retry
            self._retry_as_twin(flight, number, same)
        else:  # failed for good: so would they (answered so, without counting)
            for twin in same:
                fail_as(self.study, twin, number)

    def _retry_as_twin(self, flight: InFlight, number: int, same: list[InFlight]) -> None:
        """``flight`` failed and is retried: the first proposal that waited for it runs as the
        retry, the others wait for that one; claimed in this driver's turn, so that a trial of
        another driver that took the configuration over meanwhile (it waited for ``flight`` too)
        is waited for instead, by all of them."""
        first = same[0]
        first.attempt = flight.attempt + 1
        write(
            first.trial, {Key.ATTEMPT: first.attempt, Key.REQUEUED_FROM: number, Key.REQUEUED_WHY: "failed"}
        )
        other = claim(self.study, self.known, first.trial, flight.config.key(), self.drivers.turn)
        if other is not None:
            for twin in same:
                write(twin.trial, {WAITS_FOR: other.number})
                self.remote.append((twin, other))
            return
        self.pending.append(first)
        if same[1:]:
            self.twins[flight.config.key()] = same[1:]

    def _open_trials(self) -> list[InFlight]:
        """Every trial this driver asked and has not told: in flight, waiting, waiting for another's
        answer."""
        twins_waiting = [t for ts in self.twins.values() for t in ts] + [f for f, _ in self.remote]
        return [*self.in_flight.values(), *self.pending, *twins_waiting]

    def _failed(self, exc: Exception) -> None:
        """The run ends on ``exc``: mark every open trial interrupted (re-run on resume), as a stop
        signal does. Where the storage itself fails they stay RUNNING, for the resume to reclaim
        (this driver is dead by then); ``exc`` says so in a note."""
        open_trials = self._open_trials()
        try:
            abandon(self.study, open_trials)
        except Exception as marking:  # noqa: BLE001 - the first error is the one to report
            exc.add_note(f"trial(s) left RUNNING for the resume to reclaim: {type(marking).__name__}")
        else:
            if open_trials:
                exc.add_note(f"trial(s) {sorted(f.trial.number for f in open_trials)} marked interrupted")

    def _interrupted(self, stop: StopRequest, exc: KeyboardInterrupt) -> NoReturn:
        """Mark every trial in flight, waiting or waiting for another's answer interrupted (re-run
        on resume) and raise :class:`Interrupted`."""
        signum = stop.stopping(signal_of(exc))  # from now on another signal ends the process at once
        abandon(self.study, self._open_trials())
        with contextlib.suppress(OSError):  # a hung-up terminal (EIO): the trials are marked all the same
            self.printer(
                "interrupted: in-flight trials are marked interrupted and re-run on resume"
                f" ({signal_name(signum)})"
            )
        raise Interrupted(signum) from None
