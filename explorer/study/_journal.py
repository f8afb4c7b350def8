"""Write-ahead of finished trials: a measurement reaches disk before it reaches the storage.

The driver writes ``<output_dir>/trial-NNNNN/measurement.json`` for every trial a launcher
hands back, then records it in Optuna. A driver killed between the two leaves the trial
RUNNING with its measurement on disk; the resume records it from there (``recovered``) instead
of running the configuration a second time. A Ray trial whose worker finished (``result.json``)
while the driver was already dead is recovered the same way.

Each file names the study and the trial's storage id and start time, so a stale folder (a study
deleted and created again under the same name) is never read as this trial's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.measurement import Measurement, Outcome

if TYPE_CHECKING:
    import optuna

__all__ = ["DAMAGED_SUFFIX", "JOURNAL_FILE", "load_journal", "read_ahead", "trial_dir", "write_ahead"]

JOURNAL_FILE = "measurement.json"


def trial_dir(output_dir: Path, trial_number: int) -> Path:
    """The folder of one trial's files (the Ray launcher's work directory too)."""
    return output_dir / f"trial-{trial_number:05d}"


def _identity(study_name: str, trial: optuna.Trial | optuna.trial.FrozenTrial) -> dict[str, object]:
    start = trial.datetime_start.isoformat() if trial.datetime_start else None
    return {"study": study_name, "trial": trial.number, "trial_id": trial._trial_id, "start": start}


def write_ahead(
    output_dir: Path,
    study_name: str,
    trial: optuna.Trial | optuna.trial.FrozenTrial,
    measurement: Measurement,
) -> Path | None:
    """Write ``measurement`` for ``trial`` atomically (a reader sees all of it or nothing).

    Returns:
        The file, or ``None`` when it would resolve outside ``output_dir`` (a symlink; never
        followed for writing, :mod:`explorer.paths`): the trial is then recorded without it, and
        a Ray trial in that folder has already failed saying so.

    A live trial's number, storage id and start time are all cached on it: no storage read."""
    from explorer.paths import escape, write_atomic

    folder = trial_dir(output_dir, trial.number)
    path = folder / JOURNAL_FILE
    problem = escape(output_dir, folder) or escape(output_dir, path)
    if problem is not None:  # a symlink out of the output folder: never followed for writing
        return None
    folder.mkdir(parents=True, exist_ok=True)
    record = {**_identity(study_name, trial), "measurement": json.loads(measurement.to_json())}
    write_atomic(path, json.dumps(record))
    return path


DAMAGED_SUFFIX = ".damaged"
"""A damaged write-ahead file of a RUNNING trial is set aside under this suffix, its trial re-run."""


def load_journal(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The write-ahead record in ``path`` and ``None``, or ``None`` and what is wrong with it (a
    truncated, empty, binary or foreign file: a kill or a full disk before files were written
    whole, or a hand edit). The measurement it holds is parsed too."""
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not text"
    except json.JSONDecodeError as exc:
        return None, "empty" if not exc.doc.strip() else f"not JSON ({exc.msg} at line {exc.lineno})"
    if (
        not isinstance(record, dict)
        or not {"study", "trial", "trial_id", "start", "measurement"} <= record.keys()
    ):
        return None, "not a measurement record"
    try:
        Measurement.from_json(json.dumps(record["measurement"]))
        int(record["trial"])
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return None, f"a measurement explorer cannot read ({type(exc).__name__}: {exc})"
    return record, None


def read_ahead(output_dir: Path, study_name: str, trial: optuna.trial.FrozenTrial) -> Measurement | None:
    """The finished measurement of RUNNING ``trial`` left on disk, or ``None``: ok, oom, or a
    failed attempt (recorded as such, so that its retry counts like one the driver recorded)."""
    folder = trial_dir(output_dir, trial.number)
    path = folder / JOURNAL_FILE
    measurement: Measurement | None = None
    if path.is_file():
        record, problem = load_journal(path)
        if record is None:  # set aside, named: the trial is re-run, and nothing reads it again
            path.replace(path.with_name(path.name + DAMAGED_SUFFIX))
            return None
        if {k: record.get(k) for k in ("study", "trial", "trial_id", "start")} != _identity(
            study_name, trial
        ):
            return None
        measurement = Measurement.from_json(json.dumps(record["measurement"]))
    elif (folder / "result.json").is_file() and _written_after_start(folder / "result.json", trial):
        from explorer.launch import collect

        measurement = collect(folder, returncode=0, timed_out=None, wall_seconds=0.0, log_tail="")
    if measurement is None or measurement.outcome not in (Outcome.OK, Outcome.OOM, Outcome.FAILED):
        return None
    return measurement


def _written_after_start(path: Path, trial: optuna.trial.FrozenTrial) -> bool:
    if trial.datetime_start is None:
        return False
    return path.stat().st_mtime >= trial.datetime_start.timestamp()
