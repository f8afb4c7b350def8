"""One rule for where a study's files live (``study_folder``), followed by every verb, and a
study moved or copied to another storage path keeps working."""

from __future__ import annotations

import json
import shutil
import sqlite3

from explorer.study import open_existing_study, optimize
from explorer.study._run_folder import MARKER, study_folder
from explorer.study_file import load_study
from tests.test_failures import _in_process
from tests.test_faults import _study


def _checkpointed(db) -> None:
    with sqlite3.connect(db) as con:  # all of it in the main file, as after the last driver's exit
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def test_a_copied_storage_gets_its_own_folder_and_every_verb_agrees(write_study, tmp_path, capsys):
    """``--storage COPY`` of a study that ran: optimize resumes the copy in the copy's own folder
    (the original's folder and marker untouched), and report, best and export use that folder."""
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=3)
    optimize(load_study(path), printer=lambda _: None)
    original = load_study(path).output_dir
    _checkpointed(tmp_path / "faults.db")
    shutil.copy(tmp_path / "faults.db", tmp_path / "copy.db")
    copy = f"sqlite:///{tmp_path}/copy.db"
    run = _in_process(capsys, "optimize", str(path), "--storage", copy, "--n-trials", "5")
    assert run.returncode == 0, run.stdout + run.stderr
    loaded = load_study(path, storage=copy)
    folder = study_folder(open_existing_study(loaded), loaded)
    assert folder != original and folder.parent == original.parent
    assert json.loads((folder / MARKER).read_text())["storage"] == f"sqlite:///{tmp_path}/copy.db"
    assert json.loads((original / MARKER).read_text())["storage"] == f"sqlite:///{tmp_path}/faults.db"
    for verb in ("report", "best", "export", "audit"):
        proc = _in_process(capsys, verb, str(path), "--storage", copy)
        assert proc.returncode == 0, (verb, proc.stdout + proc.stderr)
        assert verb == "audit" or str(folder) in proc.stdout, (verb, proc.stdout)
    assert not (original / "report").exists() and not (original / "best").exists()


def test_a_moved_storage_is_handed_its_folder_with_one_step(write_study, tmp_path, capsys):
    """The storage file moved, the study file pointed at it: optimize names the one step (delete
    the old marker), and after it the study resumes in its folder and audits."""
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=3, output_dir=str(tmp_path / "run"))
    optimize(load_study(path), printer=lambda _: None)
    _checkpointed(tmp_path / "faults.db")
    (tmp_path / "moved").mkdir()
    shutil.move(tmp_path / "faults.db", tmp_path / "moved" / "faults.db")
    for leftover in tmp_path.glob("faults.db-*"):
        leftover.unlink()
    path = _study(
        write_study,
        tmp_path,
        faults={"rate": 0.0},
        n_trials=5,
        output_dir=str(tmp_path / "run"),
        storage=f"sqlite:///{tmp_path}/moved/faults.db",
    )
    refused = _in_process(capsys, "optimize", str(path))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"delete {tmp_path / 'run' / MARKER} to hand the folder over" in refused.stderr, refused.stderr
    (tmp_path / "run" / MARKER).unlink()
    assert _in_process(capsys, "optimize", str(path)).returncode == 0
    proc = _in_process(capsys, "audit", str(path))
    assert proc.returncode == 0 and "5 counted of n_trials 5" in proc.stdout, proc.stdout
    assert "measurements written ahead on disk: 5" in proc.stdout  # the moved study's 3 and the 2 new
