"""A finished study on read-only storage is read by every read-only verb; a reader never writes
Optuna's schema into a file it opened (a 0-byte file stays 0 bytes); a damaged file gets advice
that fits it. The read-only filesystem is a real one: a tmpfs remounted ``ro`` (root, as here
and in CI), which refuses root's writes too."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from explorer.study import optimize
from explorer.study_file import load_study
from tests.test_failures import _in_process, small_disk
from tests.test_faults import _study

READERS = (
    ("status",),
    ("audit",),
    ("utilization",),
    ("export", "--out", "{tmp}/trials.csv"),
    ("report", "--out", "{tmp}/report"),
    ("best", "--out", "{tmp}/best"),
    ("plan", "--tokens", "1e6"),
)
"""Every verb that reads a stored study, writing (if at all) only where ``--out`` says."""


def _run_readers(capsys, path: Path, tmp_path: Path) -> dict[str, tuple[int, str]]:
    said = {}
    for verb, *rest in READERS:
        args = [a.format(tmp=tmp_path) for a in rest]
        proc = _in_process(capsys, verb, str(path), *args)
        said[verb] = (proc.returncode, proc.stdout + proc.stderr)
    return said


def test_a_finished_study_on_a_read_only_filesystem_is_read_by_every_verb(write_study, tmp_path, capsys):
    """The study's sqlite file (in WAL mode, as optimize leaves it) on a filesystem remounted
    read-only: no WAL index can be made beside it, yet every reader reads it."""
    disk = tmp_path / "ro"
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=4)
    optimize(load_study(path), printer=lambda _: None)
    with sqlite3.connect(tmp_path / "faults.db") as con:  # as the last driver's exit leaves it
        assert con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with small_disk(disk, size_kib=4096):
        shutil.copy(tmp_path / "faults.db", disk / "s.db")
        path = _study(
            write_study, tmp_path, faults={"rate": 0.0}, n_trials=4, storage=f"sqlite:///{disk}/s.db"
        )
        before = sorted(p.name for p in disk.iterdir())
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        said = _run_readers(capsys, path, tmp_path)
        assert {verb: code for verb, (code, _) in said.items()} == dict.fromkeys(said, 0), said
        assert "4 trials" in said["status"][1] and "ok" in said["audit"][1]
        assert (tmp_path / "trials.csv").read_text().count("\n") == 5
        assert (tmp_path / "report" / "index.html").is_file()
        assert sorted(p.name for p in disk.iterdir()) == before


@pytest.mark.parametrize("content", [b"", b"this is not an sqlite database, only some text" * 100])
def test_a_reader_never_writes_a_schema_and_says_what_the_file_is(
    write_study, tmp_path, capsys, monkeypatch, content
):
    """A 0-byte file: "no study", still 0 bytes. A damaged file: one line, exit 2, no advice to
    wait for it to answer. One attempt each: a file without tables is first taken for one that a
    driver is still creating, and retried for 2 s (tests/test_storage_race.py races that)."""
    monkeypatch.setattr("explorer.study._storage.RETRIES", 1)
    monkeypatch.setattr("explorer.status.RETRIES", 1)
    db = tmp_path / "s.db"
    db.write_bytes(content)
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=4, storage=f"sqlite:///{db}")
    said = _run_readers(capsys, path, tmp_path)
    for verb, (code, out) in said.items():
        lines = [line for line in out.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "Traceback" not in out, (verb, out)
        assert "again when it answers" not in out, (verb, out)
        assert ("no study" if not content else "not a database") in out, (verb, out)
    assert db.read_bytes() == content


def test_a_damaged_file_mid_command_gets_advice_that_fits(write_study, tmp_path):
    """A study file whose pages were overwritten: the driver's error, read mid-command, is one
    line that says the file is damaged and how to recover it, not to run again."""
    from explorer.errors import crash_text

    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=3)
    optimize(load_study(path), printer=lambda _: None)
    with sqlite3.connect(tmp_path / "faults.db") as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db = tmp_path / "damaged.db"
    shutil.copy(tmp_path / "faults.db", db)
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA journal_mode=DELETE")
    data = bytearray(db.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)  # every page after the first
    db.write_bytes(bytes(data))
    con = sqlite3.connect(db)
    with pytest.raises(sqlite3.DatabaseError) as raised:
        con.execute("SELECT * FROM trials").fetchall()
    con.close()
    text = crash_text(raised.value)
    assert text.count("\n") == 1 and "the sqlite file is damaged" in text and ".recover" in text, text
    assert "again when it answers" not in text
