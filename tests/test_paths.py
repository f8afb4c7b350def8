"""A study cannot make explorer write outside its output folder (``explorer/paths.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from explorer.launch import run_trial
from explorer.measurement import Outcome
from explorer.paths import escape
from explorer.study import open_study
from explorer.study_file import load_study
from tests.builders import run_cli


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=120)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    return line


def test_escape_follows_every_symlink(tmp_path):
    root = tmp_path / "runs"
    (root / "real").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "inner-link").symlink_to(root / "real")
    (root / "out-link").symlink_to(outside)
    assert escape(root, root / "trial-00001") is None  # not there yet: fine
    assert escape(root, root / "inner-link" / "x.png") is None  # a symlink that stays inside
    assert "outside" in (escape(root, root / "out-link" / "x.png") or "")
    assert escape(root, root / ".." / "runs-sibling") is not None
    # the output folder itself may be a symlink (the user's choice); inside it is inside
    (tmp_path / "alias").symlink_to(root)
    assert escape(tmp_path / "alias", tmp_path / "alias" / "trial-00002") is None


def test_a_trial_folder_that_is_a_symlink_out_is_not_followed(make_job, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (runs / "trial-00003").symlink_to(elsewhere)
    job = make_job(batch_size=4, number_gpus=1, distributed_backend="NONE")
    m = run_trial(job, work_dir=runs / "trial-00003", timeout_s=60, warm_start=False)
    assert m.outcome is Outcome.FAILED
    assert m.error.startswith("trial folder: ") and f"outside {runs.resolve()}" in m.error
    assert list(elsewhere.iterdir()) == []  # no train.log, nothing


def test_a_train_log_that_is_a_symlink_out_is_not_followed(make_job, tmp_path):
    work = tmp_path / "runs" / "trial-00004"
    work.mkdir(parents=True)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (work / "train.log").symlink_to(victim)
    m = run_trial(
        make_job(batch_size=4, number_gpus=1, distributed_backend="NONE"),
        work_dir=work,
        timeout_s=60,
        warm_start=False,
    )
    assert m.outcome is Outcome.FAILED and "train.log resolves to" in m.error
    assert victim.read_text() == "keep me"


@pytest.fixture
def stored_study(write_study, tmp_path) -> Path:
    path = write_study({"storage": f"sqlite:///{tmp_path}/s.db", "output_dir": "runs"})
    open_study(load_study(path), create=True)
    (tmp_path / "runs").mkdir()
    return path


def test_report_into_a_symlinked_report_folder_is_refused(stored_study, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "runs" / "report").symlink_to(elsewhere)
    line = _one_line(_cli("report", str(stored_study)))
    assert f"{stored_study}: output_dir: {tmp_path / 'runs' / 'report'} resolves to {elsewhere}" in line
    assert "nothing written" in line
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "runs" / "artifacts").exists()


def test_a_symlinked_figure_in_the_report_folder_is_refused(stored_study, tmp_path):
    victim = tmp_path / "precious.png"
    victim.write_bytes(b"keep me")
    (tmp_path / "runs" / "report").mkdir()
    (tmp_path / "runs" / "report" / "history.png").symlink_to(victim)
    line = _one_line(_cli("report", str(stored_study)))
    assert "history.png resolves to" in line
    assert victim.read_bytes() == b"keep me"


def test_the_default_export_cannot_be_a_symlink_out(stored_study, tmp_path):
    victim = tmp_path / "precious.csv"
    victim.write_text("keep me")
    (tmp_path / "runs" / "test.csv").symlink_to(victim)
    line = _one_line(_cli("export", str(stored_study)))
    assert "test.csv resolves to" in line and victim.read_text() == "keep me"
    # --out is the user's own choice, taken as given
    out = tmp_path / "chosen.csv"
    proc = _cli("export", str(stored_study), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()


def test_output_dir_is_resolved_relative_to_the_study_file(write_study, tmp_path):
    loaded = load_study(write_study({"output_dir": "../runs-here"}))
    assert loaded.output_dir == (tmp_path.parent / "runs-here").resolve()


def test_a_storage_identity_holds_no_credentials():
    """The run folder's marker names the storage without user, password or options, also when an
    unencoded ``@`` in the password makes sqlalchemy read part of it as the host."""
    from explorer.paths import storage_identity

    for url in (
        "postgresql+psycopg://u:p@ss@db:5432/o",
        "postgresql+psycopg://u:pss@db:5432/o?sslmode=require",
        "postgresql+psycopg://u@db:5432/o?password=pss",
    ):
        assert storage_identity(url) == "postgresql://db:5432/o", url
    assert storage_identity("sqlite:///rel.db").startswith("sqlite:////")
