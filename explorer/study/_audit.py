"""The accounting invariant: after any faults and a resume, every trial is in exactly one state.

A study's *trials* are its configurations' final answers (what counts towards ``n_trials``):

* **feasible**: measured ok;
* **infeasible**, with a reason: out of memory (measured, or inferred from a measured OOM) or
  invalid for the resources;
* **failed**, with its error, after its retries ran out.

Every other Optuna trial is bookkeeping that must lead to one of those: an attempt that failed
and was retried (``retry``), or was cut short by the driver's death or Ctrl-C (``interrupted``),
leads to the trial re-enqueued from it (``requeued_from``); a trial asked by a driver that died
before starting it is ``abandoned`` (and enqueued again if it was an enqueued one); a repeated proposal answered from an
earlier trial (``reused_from``) or inferred (``inferred_from``) names its source.

:func:`audit` checks all of it against the storage and, for lost measurements, against the
write-ahead files on disk (:mod:`explorer.study._journal`): no trial RUNNING or left waiting, no
measurement on disk missing from the storage, no configuration measured twice, ``n_trials``
honoured (never exceeded; reached unless the study recorded why it stopped short), and every injected fault ended the way :func:`explorer.fault.expected_status` says.

The confirmation of the best (:mod:`explorer.study._confirm`) is no trial: its re-measurements are
launcher jobs, each tied to the feasible trial it re-measures among its candidates, and their
GPU-seconds add up to its recorded total; they never count towards ``n_trials``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.fault import expected_status
from explorer.record import Status, StudyKey, StudyRecord, TrialRecord, infeasibility, status_of
from explorer.study._confirm import CONFIRM_JOB_BASE
from explorer.study._journal import JOURNAL_FILE, load_journal
from explorer.study._objectives import objective_value

if TYPE_CHECKING:
    import optuna

__all__ = ["RUN_N_TRIALS", "Audit", "audit"]

RUN_N_TRIALS = StudyKey.N_TRIALS
"""Study record key: the ``n_trials`` the last ``optimize`` run used (the file's, or
``--n-trials``); :func:`audit` holds the study to it."""

FINAL = {"ok": "feasible", "oom": "infeasible", "invalid": "infeasible", "failed": "failed"}


@dataclass
class Audit:
    """What :func:`audit` found; ``ok`` when nothing is wrong."""

    n_trials: int
    counted: int = 0
    states: Counter[str] = field(default_factory=Counter)
    """Counted trials by final state: feasible, infeasible, failed."""
    bookkeeping: Counter[str] = field(default_factory=Counter)
    """Other Optuna trials: retry, interrupted, reused, inferred, recovered (a counted trial
    recorded from disk on resume is also counted under its final state)."""
    faults: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    """Injected fault kind -> status of the attempts it was given."""
    measurements_on_disk: int = 0
    stopped_early: str | None = None
    """Why the study ended short of ``n_trials``, as its last run recorded it (then fewer counted
    trials are no problem; more never are)."""
    confirmations: int = 0
    """Re-measurements that confirmed the best (launcher jobs, never trials: not counted)."""
    confirmation: str | None = None
    """The confirmation's account: which trials it re-measured, its GPU-seconds, its verdict."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        """A few lines for people."""
        states = ", ".join(f"{self.states[k]} {k}" for k in ("feasible", "infeasible", "failed"))
        other = ", ".join(f"{n} {k}" for k, n in sorted(self.bookkeeping.items())) or "none"
        lines = [
            f"trials: {self.counted} counted of n_trials {self.n_trials}: {states}",
            f"other records: {other}",
            f"measurements written ahead on disk: {self.measurements_on_disk}",
        ]
        if self.stopped_early:
            lines.append(f"stopped early: {self.stopped_early}")
        if self.confirmation:
            lines.append(f"confirmation: {self.confirmation}")
        for kind, statuses in sorted(self.faults.items()):
            lines.append(f"injected {kind}: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
        lines.append("accounting: ok" if self.ok else f"accounting: {len(self.problems)} problem(s)")
        lines.extend(f"  {p}" for p in self.problems)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "n_trials": self.n_trials,
            "counted": self.counted,
            "states": dict(self.states),
            "bookkeeping": dict(self.bookkeeping),
            "faults": {k: dict(v) for k, v in sorted(self.faults.items())},
            "measurements_on_disk": self.measurements_on_disk,
            "stopped_early": self.stopped_early,
            "confirmations": self.confirmations,
            "problems": list(self.problems),
        }


def audit(study: optuna.Study, *, n_trials: int, max_retries: int, output_dir: Path | None) -> Audit:
    """Check the accounting invariant of ``study`` (see the module docstring).

    Args:
        n_trials: the study file's ``n_trials``; the one the last run used when the study
            records it (:data:`RUN_N_TRIALS`: ``optimize --n-trials N`` audits against N).
        max_retries: the study file's ``launcher.max_retries``.
        output_dir: where the write-ahead files are (``None``: skip the lost-measurement check).
    """
    import optuna

    State = optuna.trial.TrialState
    recorded = StudyRecord.of(study).n_trials
    n_trials = recorded if recorded is not None else n_trials
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    records = {t.number: TrialRecord.of(t) for t in trials}
    successors = {r.requeued_from: r for r in records.values() if r.requeued_from is not None}
    out = Audit(n_trials=n_trials)
    problem = out.problems.append
    measured: dict[str, list[int]] = defaultdict(list)

    for t in trials:
        record = records[t.number]
        status = record.status
        if t.state is State.RUNNING:
            problem(f"trial {t.number}: stuck RUNNING")
            continue
        if t.state is State.WAITING:
            problem(f"trial {t.number}: enqueued but never run")
            continue
        if (kind := record.injected_fault) is not None:
            out.faults[kind][str(status)] += 1
            if status != Status.INTERRUPTED and not _fault_ended_as_expected(kind, record, max_retries):
                problem(f"trial {t.number}: injected {kind} ended as {status!r}")
        if record.counts:
            out.counted += 1
            out.states[FINAL[str(status)]] += 1
            if record.recovered is not None:
                out.bookkeeping["recovered"] += 1
            if status in (Status.OOM, Status.INVALID) and not record.error:
                problem(f"trial {t.number}: infeasible without a reason")
            if status in (Status.OOM, Status.INVALID) and not infeasibility(t) > 0:
                problem(f"trial {t.number}: {status} but its constraint does not mark it infeasible")
            if status == Status.FAILED and not record.error:
                problem(f"trial {t.number}: failed without an error")
            if status == Status.FAILED and record.attempt < max_retries:
                problem(f"trial {t.number}: failed with retries left")
            if status in (Status.OK, Status.OOM) and record.reused_from_store is None:
                measured[str(record.config_key)].append(t.number)
            continue
        if record.answered_without_running:
            kind = "reused" if record.reused_from is not None else "inferred"
            out.bookkeeping[kind] += 1
            source = record.reused_from if record.reused_from is not None else record.inferred_from
            if source not in by_number:
                problem(f"trial {t.number}: answered from trial {source}, which does not exist")
            continue
        if status == Status.SURPLUS:  # a re-run nobody needed: n_trials counted before it came up
            out.bookkeeping[status] += 1
            continue
        if status == Status.ABANDONED:  # asked, never started; an enqueued one was enqueued again
            out.bookkeeping[status] += 1
            if t.system_attrs.get("fixed_params") and t.number not in successors:
                problem(f"trial {t.number}: abandoned but its enqueued configuration was not enqueued again")
            continue
        if status in (Status.RETRY, Status.INTERRUPTED):
            out.bookkeeping[status] += 1
            if t.number not in successors:
                problem(f"trial {t.number}: {status} but never re-enqueued")
            continue
        problem(f"trial {t.number}: state {t.state.name}, status {status!r}: not accounted for")

    _check_totals(study, out, measured)
    _check_confirmation(study, by_number, out)
    if output_dir is not None:
        _check_journal(output_dir, study.study_name, by_number, out)
    return out


def _check_totals(study: optuna.Study, out: Audit, measured: dict[str, list[int]]) -> None:
    """No configuration measured twice; ``n_trials`` reached (unless the study says why not)."""
    for key, numbers in measured.items():
        if len(numbers) > 1:
            out.problems.append(f"configuration measured {len(numbers)} times: trials {numbers} ({key})")
    stopped = StudyRecord.of(study).stopped_early
    if stopped is not None and stopped.get("counted") == out.counted:
        out.stopped_early = str(stopped.get("why"))
    n_trials = out.n_trials
    if out.counted > n_trials or (out.counted < n_trials and out.stopped_early is None):
        out.problems.append(f"{out.counted} trials counted, n_trials is {n_trials}")


def _check_confirmation(
    study: optuna.Study, by_number: dict[int, optuna.trial.FrozenTrial], out: Audit
) -> None:
    """Each re-measurement of the confirmation ties to a feasible trial it confirms, among its
    candidates; their GPU-seconds add up to its total; its verdict names its candidates."""
    record = StudyRecord.of(study).confirmation
    if record is None:
        return
    candidates = set(record.get("candidates") or [])
    measurements = record.get("measurements") or []
    problem = out.problems.append
    for n in sorted(candidates):
        if n not in by_number or status_of(by_number[n]) != Status.OK:
            problem(f"confirmation: candidate trial {n} is not a feasible trial of the study")
    jobs = [m.get("job") for m in measurements]
    if len(set(jobs)) != len(jobs) or any(not isinstance(j, int) or j <= CONFIRM_JOB_BASE for j in jobs):
        problem(f"confirmation: its jobs {jobs} are not distinct numbers above {CONFIRM_JOB_BASE}")
    for m in measurements:
        if m.get("trial") not in candidates:
            problem(f"confirmation: job {m.get('job')} re-measured trial {m.get('trial')}, not a candidate")
    spent = sum(float(m.get("gpu_seconds") or 0.0) for m in measurements)
    if abs(spent - float(record.get("gpu_seconds") or 0.0)) > 1e-6 * max(1.0, spent):
        problem(
            f"confirmation: its re-measurements took {spent:.1f} GPU-s, it records {record.get('gpu_seconds')}"
        )
    named = {record.get("best"), record.get("recommended", record.get("best")), *(record.get("tied") or [])}
    if not named <= candidates:
        problem(
            f"confirmation: its verdict names trial(s) {sorted(named - candidates, key=str)}, not candidates"
        )
    out.confirmations = len(measurements)
    trials = sorted({m.get("trial") for m in measurements}, key=str)
    out.confirmation = (
        f"{len(measurements)} re-measurement(s) of trial(s) {trials} ({spent:.0f} GPU-s, not counted); "
        f"{record.get('verdict')}: trial {record.get('recommended', record.get('best'))}"
    )


def _fault_ended_as_expected(kind: str, record: TrialRecord, max_retries: int) -> bool:
    retried = record.attempt < max_retries
    status = record.status
    if status == Status.OOM and kind != "oom":  # an OOM of the configuration itself struck first
        return "injected" not in (record.error or "")
    if kind != "node_restart" and "the node restarted" in (record.error or ""):
        # another trial's node restart took this one down before its own fault struck: a lost attempt
        return status == expected_status("node_restart", retried=retried)
    return status == expected_status(kind, retried=retried)


def _check_journal(
    output_dir: Path, study_name: str, by_number: dict[int, optuna.trial.FrozenTrial], out: Audit
) -> None:
    """Every measurement written ahead on disk is in the storage, with the same outcome and value."""
    for path in sorted(output_dir.glob(f"trial-*/{JOURNAL_FILE}")):
        record, problem = load_journal(path)
        if record is None:
            out.problems.append(
                f"damaged: {path} is {problem}: compare it with the trial's record (explorer status), "
                "then delete it or restore it from a copy"
            )
            continue
        if record.get("study") != study_name:
            continue
        out.measurements_on_disk += 1
        number = int(record["trial"])
        t = by_number.get(number)
        outcome = record["measurement"]["outcome"]
        if t is None or t._trial_id != record.get("trial_id"):
            out.problems.append(f"lost: {path} has no trial {number} in the storage")
            continue
        status = status_of(t)
        if outcome == "failed":
            if status not in ("retry", "failed"):
                out.problems.append(f"lost: trial {number} failed on disk but is {status!r} in the storage")
            continue
        if status != outcome:
            out.problems.append(f"lost: trial {number} is {outcome} on disk but {status!r} in the storage")
            continue
        properties = record["measurement"].get("properties") or {}
        on_disk = properties.get("dataset_tokens_per_second_per_gpu")
        stored = objective_value(t)
        if outcome == "ok" and (
            stored is None or on_disk is None or abs(stored - float(on_disk)) > 1e-6 * abs(stored)
        ):
            out.problems.append(f"lost: trial {number} measured {on_disk} on disk, {stored} in the storage")
