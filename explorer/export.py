"""``explorer export``: a study's measured trials as a CSV in ado's ``show entities`` layout.

One row per trial that measured something (ok, oom, invalid; reused answers and failed trials are
left out; inferred OOMs are kept and say so in ``inferred_from``; answers from the measurement
store are kept and say ``study:trial`` in ``reused_from_store``). Columns: ``identifier`` (the
canonical configuration key), ``model_name``, ``gpu_model``, ``method``, every configuration field,
every measured property under the seeds' names, ``status`` and ``is_valid``. The replay launcher
reads the file back as it is.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["export_csv", "export_rows"]

_SKIP = {"attempt", "config_key", "log_tail", "log_file"}
"""Bookkeeping left out (dict and list attributes, such as the fingerprint or step times, are too)."""


def export_rows(loaded: LoadedStudy) -> list[dict[str, Any]]:
    """The study's measured trials, as flat rows."""
    from explorer.study import open_study, status_of

    try:
        study = open_study(loaded, create=False)
    except KeyError:  # optuna: "Record does not exist."
        from explorer.errors import SpecError
        from explorer.study import mask_url

        raise SpecError(
            file=str(loaded.file),
            field="name",
            problem=f"no study {loaded.spec.name!r} in {mask_url(loaded.storage_url)}",
        ) from None
    names = [f.name for f in dataclasses.fields(TrialConfig)]
    rows = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        status = status_of(t)
        if status not in ("ok", "oom", "invalid") or "reused_from" in t.user_attrs:
            continue
        row: dict[str, Any] = {
            "identifier": t.user_attrs.get("config_key", ""),
            "trial": t.number,
            "model_name": loaded.spec.workload.model.name,
            "gpu_model": loaded.spec.resources.gpu_model,
            "method": loaded.spec.workload.method.kind,
        }
        row.update({n: t.user_attrs.get(n) for n in names})
        for key, value in t.user_attrs.items():
            if key in row or key in _SKIP or isinstance(value, (dict, list)):
                continue
            row[key] = value
        source = t.user_attrs.get("reused_from_store")
        if isinstance(source, dict):  # dicts are left out above; this one names a trial
            row["reused_from_store"] = f"{source.get('study')}:{source.get('trial')}"
        row["status"] = status
        row["is_valid"] = 1 if status == "ok" else 0
        rows.append(row)
    return rows


def export_csv(loaded: LoadedStudy, path: Path) -> int:
    """Write the rows to ``path``; returns how many."""
    rows = export_rows(loaded)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return len(rows)
