"""A study's sqlite file with damaged pages, in a table explorer never reads, is refused in one
line by every verb that opens it: nothing read as if whole, nothing written into it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from explorer.cli import main
from explorer.measurement import Measurement, Outcome
from tests.builders import properties


def _study_with_a_trial(write_study, tmp_path: Path) -> tuple[Path, Path]:
    from explorer.study import open_study, record_outcome
    from explorer.study_file import load_study

    db = tmp_path / "s.db"
    path = write_study({"storage": f"sqlite:///{db}", "output_dir": str(tmp_path / "runs")})
    study = open_study(load_study(path), create=True)
    trial = study.ask()
    trial.suggest_int("log2_batch_size", 0, 6)
    record_outcome(study, trial, Measurement(outcome=Outcome.OK, properties=properties(1000.0)))
    study._storage._backend.engine.dispose()  # type: ignore[attr-defined]  # every connection closed
    return path, db


def _damage_a_table_nobody_reads(db: Path) -> None:
    """A table of several pages beside Optuna's, then its root page overwritten with garbage."""
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("CREATE TABLE notes_of_someone_else (x TEXT)")
    con.executemany("INSERT INTO notes_of_someone_else VALUES (?)", [("x" * 500,) for _ in range(200)])
    con.commit()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    (root,) = con.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'notes_of_someone_else'"
    ).fetchone()
    con.close()
    with open(db, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\xa5" * page_size)


@pytest.mark.parametrize("verb", ["status", "best", "report", "export", "audit", "optimize"])
def test_every_verb_refuses_a_damaged_file_in_one_line(
    write_study, tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    path, db = _study_with_a_trial(write_study, tmp_path)
    _damage_a_table_nobody_reads(db)
    before = db.read_bytes()
    assert main([verb, str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is damaged" in err[0] and str(db) in err[0] and ".recover" in err[0], err
    assert db.read_bytes() == before  # nothing written into it
    assert not (tmp_path / "runs" / "report").exists() and not (tmp_path / "runs" / "best").exists()


def test_a_whole_file_passes(write_study, tmp_path: Path) -> None:
    from explorer.study._storage import check_intact

    _, db = _study_with_a_trial(write_study, tmp_path)
    check_intact(str(db))  # no error
