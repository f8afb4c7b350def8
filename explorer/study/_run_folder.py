"""A study's run folder belongs to the study in its storage, not to the study file.

``optimize`` records the folder in the study (its record's ``run_folder``), so that a study's files
can be found from its storage alone, and claims it with a marker file (``.explorer-study``: the
study's name and storage, no credentials). A folder that another storage's study has claimed is
refused: two storages never share trial files (``trial-00004`` of one would overwrite the
other's). The default folder is already one per storage (:func:`explorer.paths.default_output_dir`);
the marker catches an ``output_dir`` set by hand to a folder some other storage uses.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.errors import SpecError
from explorer.paths import storage_identity, write_atomic
from explorer.record import StudyKey, StudyRecord, write_study
from explorer.spec import LoadedStudy

if TYPE_CHECKING:
    import optuna

__all__ = [
    "MARKER",
    "RUN_FOLDER",
    "check_run_folder",
    "check_writable",
    "claim_run_folder",
    "recorded_run_folder",
    "study_folder",
]

RUN_FOLDER = StudyKey.RUN_FOLDER
"""Study record key: the absolute path of the study's run folder."""
MARKER = ".explorer-study"
"""The file in a run folder that names the study (and storage) the folder belongs to."""


def _owner(loaded: LoadedStudy) -> dict[str, str]:
    return {"study": loaded.spec.name, "storage": storage_identity(loaded.storage_url)}


def _read_marker(marker: Path) -> dict[str, str] | None:
    """The owner a marker names; ``None`` for no marker, or an empty one (a claim cut short by a
    full disk before markers were written whole: reclaimed by the next claim)."""
    try:
        text = marker.read_bytes().decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not text.strip():
        return None
    try:
        owner = json.loads(text)
    except json.JSONDecodeError:
        owner = None
    if not isinstance(owner, dict):
        return {
            "study": "?",
            "storage": f"a marker explorer cannot read ({marker}; if the folder is this study's, delete the marker)",
        }
    return owner


def _write_marker(folder: Path, owner: dict[str, str]) -> None:
    """Write the marker whole (a temporary file, then linked into place): created at most once,
    by whoever comes first, and an empty one left by an older explorer is replaced."""
    marker = folder / MARKER
    tmp = folder / f".{MARKER}.tmp{os.getpid()}"
    write_atomic(tmp, json.dumps(owner))
    try:
        os.link(tmp, marker)  # fails when a marker is there: never overwritten
    except FileExistsError:
        if marker.stat().st_size == 0:
            os.replace(tmp, marker)
    finally:
        tmp.unlink(missing_ok=True)


def check_run_folder(loaded: LoadedStudy, folder: Path | None = None) -> None:
    """Refuse ``folder`` (default: ``loaded.output_dir``) when another study has claimed it.

    Raises:
        SpecError: naming the study and storage that own it; nothing is written.
    """
    folder = folder or loaded.output_dir
    owner = _read_marker(folder / MARKER)
    if owner is None:
        return
    if owner != _owner(loaded):
        moved = (
            f"if this storage is that one moved, delete {folder / MARKER} to hand the folder over; else "
            if owner.get("study") == loaded.spec.name
            else ""
        )
        raise SpecError(
            file=str(loaded.file),
            field="output_dir",
            problem=f"{folder} holds the trials of study {owner.get('study')!r} in {owner.get('storage')}; "
            f"{moved}give this study's storage its own output_dir",
        )


def claim_run_folder(study: optuna.Study, loaded: LoadedStudy) -> LoadedStudy:
    """``loaded`` with the study's run folder: the one recorded in the storage, else
    ``loaded.output_dir``, claimed now (marker written, folder recorded). Call it in the
    driver's turn, so that two drivers of one study record one folder.

    Raises:
        SpecError: the folder belongs to another storage's study.
    """
    recorded = StudyRecord.of(study).get(RUN_FOLDER)
    folder = study_folder(study, loaded)
    check_run_folder(loaded, folder)
    folder.mkdir(parents=True, exist_ok=True)
    if _read_marker(folder / MARKER) is None:
        _write_marker(folder, _owner(loaded))
    check_run_folder(loaded, folder)  # a loser of the race re-checks the winner's
    if recorded != str(folder):
        write_study(study, RUN_FOLDER, str(folder))
    return dataclasses.replace(loaded, output_dir=folder)


def study_folder(study: optuna.Study, loaded: LoadedStudy) -> Path:
    """Where a study's files live, the one rule every verb follows: the run folder recorded in
    its storage while that folder is still this storage's (its marker names it, or there is no
    marker); else (a study made before folders were recorded, or a storage copied or restored to
    another path, whose recorded folder belongs to the original) the study file's ``output_dir``
    (by default one folder per storage, :func:`explorer.paths.default_output_dir`).

    To move a study: move its storage (and, to keep its trial files, its folder), point the study
    file at them, and delete the old marker if ``optimize`` asks for it."""
    recorded = StudyRecord.of(study).run_folder
    if recorded is not None:
        owner = _read_marker(Path(recorded) / MARKER)
        if owner is None or owner == _owner(loaded):
            return Path(recorded)
    return loaded.output_dir


def recorded_run_folder(study: optuna.Study, loaded: LoadedStudy) -> LoadedStudy:
    """``loaded`` with the study's folder (:func:`study_folder`), for the readers: audit, best,
    export, plan, report."""
    folder = study_folder(study, loaded)
    return loaded if folder == loaded.output_dir else dataclasses.replace(loaded, output_dir=folder)


def _not_writable(path: Path) -> str | None:
    """Why ``path`` (a file or folder, or where one would be made) cannot be written; ``None``: it can.

    The nearest folder that exists must let this user create files (a read-only filesystem
    refuses root too), and an existing file must be writable."""
    at = path
    while not at.exists() and at != at.parent:
        at = at.parent
    if at.is_file() and not os.access(at, os.W_OK):
        return f"{at} is read-only"
    folder = at if at.is_dir() else at.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {folder} is read-only for this user"
    return None


def check_writable(loaded: LoadedStudy) -> None:
    """Refuse a study ``optimize`` could not write: an sqlite storage file or its folder (its
    journal goes there) that is read-only, or a run folder that cannot be made or written.

    Raises:
        SpecError: naming the field; nothing is written.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(loaded.storage_url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        db = Path(parsed.database)
        problem = _not_writable(db) or _not_writable(db.parent)
        if problem is not None:
            raise SpecError(
                file=str(loaded.file),
                field="storage",
                problem=f"cannot write the study: {problem} (the read-only commands can read it)",
            )
    problem = _not_writable(loaded.output_dir)
    if problem is not None:
        raise SpecError(
            file=str(loaded.file), field="output_dir", problem=f"cannot write trial files: {problem}"
        )
