"""``explorer export``: a study's measured trials as a CSV in ado's ``show entities`` layout.

One row per trial that measured something (ok, oom, invalid; reused answers and failed trials are
left out; inferred OOMs are kept and say so in ``inferred_from``; answers from the measurement
store are kept and say ``study:trial`` in ``reused_from_store``). Columns: ``identifier`` (the
canonical configuration key), ``model_name``, ``gpu_model`` (the trial's: the knob where the study
searches it, else the study's ``resources.gpu_model``), ``method``, every configuration field,
every measured property under the seeds' names, ``status`` and ``is_valid``. The replay launcher
reads the file back as it is.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.paths import atomic_file, write_atomic
from explorer.record import Key, TrialRecord
from explorer.trial_config import field_names

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["export_rows", "write_export"]

_SKIP = {Key.ATTEMPT, Key.CONFIG_KEY, "log_tail", Key.PROPOSED_BY, Key.LOG_FILE}
"""Bookkeeping left out (dict and list attributes, such as the fingerprint or step times, are too)."""
_AFTER = {Key.IS_VALID, Key.STATUS, Key.REUSED_FROM, Key.INFERRED_FROM, Key.REUSED_FROM_STORE}
"""Written last, in this order, whatever the trial holds."""


def export_rows(loaded: LoadedStudy) -> list[dict[str, Any]]:
    """The study's finished trials, as flat rows in ado's column order."""
    import optuna

    from explorer.study import open_existing_study

    study = open_existing_study(loaded)
    names = field_names()
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
    rows = []
    for t in sorted(study.get_trials(deepcopy=False, states=finished), key=lambda t: t.number):
        record = TrialRecord.of(t)
        status = record.status
        row: dict[str, Any] = {
            "identifier": record.get(Key.CONFIG_KEY, ""),
            "generatorid": record.get(Key.PROPOSED_BY, f"explorer-{loaded.spec.sampler.kind}"),
            "experiment_id": f"explorer.{loaded.spec.name}",
            "model_name": loaded.spec.workload.model.name,
            "gpu_model": loaded.spec.resources.model_of(record.get(Key.GPU_MODEL)),  # the trial's
            "method": loaded.spec.workload.method.kind,
        }
        row.update({n: record.get(n) for n in names if n != Key.GPU_MODEL})
        for key, value in record.items():
            if key in row or key in _SKIP or key in _AFTER or isinstance(value, (dict, list)):
                continue
            row[key] = value
        row["is_valid"] = {"ok": 1, "oom": 0, "invalid": 0}.get(str(status), "")
        row["status"] = status or t.state.name.lower()
        row["trial"] = t.number
        for key in (Key.REUSED_FROM, Key.INFERRED_FROM):
            row[key] = record.get(key, "")
        source = record.reused_from_store
        row[Key.REUSED_FROM_STORE] = (
            f"{source.get('study')}:{source.get('trial')}" if source is not None else ""
        )
        rows.append(row)
    return rows


def write_export(loaded: LoadedStudy, path: Path, *, fmt: str = "csv") -> int:
    """Write the rows to ``path`` as ``fmt`` (csv or json); returns how many."""
    rows = export_rows(loaded)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        write_atomic(path, json.dumps(rows, indent=1, allow_nan=True))
        return len(rows)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with atomic_file(path, "w", newline="") as fh:  # a killed export leaves no partial table
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
    return len(rows)
