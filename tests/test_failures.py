"""Every way ``optimize`` can end on an error leaves the study whole: its open trials marked
interrupted (re-run on resume), one masked line, exit status 1. The full disk is a real one: a
small tmpfs mounted for the test (root, as here and in CI; elsewhere the test says it cannot)."""

from __future__ import annotations

import contextlib
import errno
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from explorer.errors import SpecError
from explorer.study import open_study, optimize, status_of
from explorer.study._run_folder import MARKER, claim_run_folder
from explorer.study_file import load_study
from tests.builders import run_cli
from tests.test_faults import _audit, _study


@contextlib.contextmanager
def small_disk(where: Path, size_kib: int = 256) -> Iterator[Path]:
    """A real filesystem of ``size_kib`` KiB at ``where`` (tmpfs), unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs mount, which this machine refuses: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte (a file written until the filesystem says ENOSPC)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def _states(path: Path, storage: str | None = None) -> dict[int, tuple[str, str | None]]:
    study = open_study(load_study(path, storage=storage), create=False)
    return {t.number: (t.state.name, status_of(t)) for t in study.get_trials()}


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_full_disk_at_the_write_ahead_is_one_line_and_marks_the_trials(write_study, tmp_path, capsys):
    """The run folder on a full tmpfs (the storage elsewhere): the first measurement to be written
    ahead fails with ENOSPC; every open trial is marked interrupted, none stays RUNNING, and the
    run resumes to the end once the disk has room."""
    disk = tmp_path / "disk"
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=6, output_dir=str(disk / "run"))
    with small_disk(disk):
        loaded = load_study(path)
        claim_run_folder(open_study(loaded, create=True), loaded)  # the marker fits; nothing else does
        filler = fill(disk)
        proc = _in_process(capsys, "optimize", str(path))
        line = _one_line(proc.stderr)
        print(line)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "[Errno 28] No space left on device" in line and "marked interrupted" in line, line
        states = _states(path)
        assert "RUNNING" not in {state for state, _ in states.values()}, states
        assert any(status == "interrupted" for _, status in states.values()), states
        debug = _in_process(capsys, "optimize", str(path), "--debug")  # the traceback, on request
        assert debug.returncode == 1 and "Traceback" in debug.stderr and "Errno 28" in debug.stderr
        filler.unlink()
        optimize(load_study(path), printer=lambda _: None)  # resumed, in this process
    found = _audit(path)
    assert found.ok and found.counted == 6, found.describe()


def test_a_full_disk_when_the_folder_is_claimed_leaves_no_marker(write_study, tmp_path, capsys):
    """Claiming the run folder on a full disk: one line, no marker (nor a temporary file) left
    behind, and the next run claims the folder."""
    disk = tmp_path / "disk"
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=2, output_dir=str(disk / "run"))
    with small_disk(disk):
        (disk / "run").mkdir()
        filler = fill(disk)
        proc = _in_process(capsys, "optimize", str(path))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "No space left on device" in _one_line(proc.stderr)
        assert sorted(p.name for p in (disk / "run").iterdir()) == []
        assert _states(path) == {}  # nothing was asked
        filler.unlink()
        optimize(load_study(path), printer=lambda _: None)
        owner = json.loads((disk / "run" / MARKER).read_text())
        assert owner["study"] == "test"


def test_an_empty_marker_is_reclaimed(write_study, tmp_path):
    """An empty marker (a claim an older explorer cut short on a full disk) is claimed anew; a
    marker that holds something explorer cannot read is still refused."""
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=2, output_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / MARKER).write_text("")
    optimize(load_study(path), printer=lambda _: None)
    assert json.loads((tmp_path / "run" / MARKER).read_text())["study"] == "test"
    other = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=2, output_dir=str(tmp_path / "run2"))
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / MARKER).write_text("{not json")
    with pytest.raises(SpecError, match="a marker explorer cannot read"):
        optimize(load_study(other), printer=lambda _: None)


def test_an_error_inside_the_loop_marks_every_open_trial(write_study, tmp_path):
    """Ray starts after the first trial is asked: a launcher whose start fails (here a real
    NotADirectoryError from the filesystem, raised after the launcher's own start) leaves that
    trial marked interrupted, not RUNNING, and its re-run enqueued."""
    from explorer.launch import launcher_for

    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=2)
    loaded = load_study(path)
    launcher = launcher_for(loaded, output_dir=loaded.output_dir)
    starts = launcher.start

    def start() -> None:  # the launcher's own start, on a work folder that cannot be made
        starts()
        (tmp_path / "blocked").write_text("")
        (tmp_path / "blocked" / "x").mkdir()

    launcher.start = start  # type: ignore[method-assign]
    with pytest.raises(OSError) as raised:
        optimize(loaded, printer=lambda _: None, launcher=launcher)
    assert "trial(s) [0] marked interrupted" in raised.value.__notes__[0]
    study = open_study(loaded, create=False)
    first = study.trials[0]
    assert first.state is optuna.trial.TrialState.FAIL and status_of(first) == "interrupted"
    assert study.trials[1].state is optuna.trial.TrialState.WAITING  # its re-run, enqueued


def _in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``explorer ARGS`` in this process (``explorer.cli.main``), its output captured."""
    from explorer.cli import main

    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, captured.out, captured.err)


def test_a_read_only_storage_folder_or_run_folder_is_refused_before_anything(write_study, tmp_path, capsys):
    """validate and optimize refuse an sqlite storage in a read-only folder, and a run folder on a
    read-only filesystem, with one line naming the field (exit 2), before anything is written."""
    ro = tmp_path / "ro"
    with small_disk(ro):
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        for field, patch in (("storage", {"storage": f"sqlite:///{ro}/s.db"}), ("output_dir", {})):
            path = _study(write_study, tmp_path, faults={"rate": 0.0}, output_dir=str(ro / "run"), **patch)
            for verb in ("validate", "optimize"):
                proc = _in_process(capsys, verb, str(path))
                line = _one_line(proc.stderr)
                assert proc.returncode == 2, proc.stdout + proc.stderr
                assert f"{path}: {field}: cannot write" in line and "read-only" in line, line
        assert not (tmp_path / "faults.db").exists()  # the run-folder case wrote no storage either


def test_an_export_that_fails_midway_leaves_the_previous_file_whole(write_study, tmp_path):
    """An export on a full disk fails and leaves the previous export as it was (no partial
    table at the final path, no temporary file)."""
    from explorer.export import write_export

    disk = tmp_path / "disk"
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=3)
    optimize(load_study(path), printer=lambda _: None)
    with small_disk(disk, size_kib=64):
        out = disk / "trials.csv"
        assert write_export(load_study(path), out) == 3
        before = out.read_bytes()
        fill(disk)
        with pytest.raises(OSError) as raised:
            write_export(load_study(path), out)
        assert raised.value.errno == errno.ENOSPC
        assert out.read_bytes() == before
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "trials.csv"]


@pytest.mark.slow  # Ray gives up on its own start after about 30 s
def test_ray_failing_to_start_on_a_full_tmp_is_one_line_and_marks_the_first_trial(write_study, tmp_path):
    """Ray's temporary folder on a full tmpfs: Ray cannot start (it starts after the first trial
    is asked). One line, exit 1, that trial interrupted (not RUNNING), its re-run enqueued."""
    disk = tmp_path / "raytmp"
    path = write_study({"storage": f"sqlite:///{tmp_path}/ray.db", "n_trials": 1})
    with small_disk(disk):
        fill(disk)
        proc = run_cli("optimize", str(path), timeout=240, env={"RAY_TMPDIR": str(disk)})
    line = _one_line(proc.stderr)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert line.startswith("explorer: error: ") and "trial(s) [0] marked interrupted" in line, line
    assert f"Ray's temporary folder {disk} has 0 KiB free" in line, line
    states = _states(path)
    assert states[0] == ("FAIL", "interrupted") and states[1] == ("WAITING", None), states


def test_audit_holds_the_study_to_the_n_trials_its_last_run_used(write_study, tmp_path, capsys):
    """``optimize --n-trials 3`` on a file that says 6: audit passes (3 counted of 3); a later run
    on the file's 6 holds it to 6."""
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=6)
    assert _in_process(capsys, "optimize", str(path), "--n-trials", "3").returncode == 0
    proc = _in_process(capsys, "audit", str(path))
    assert proc.returncode == 0 and "3 counted of n_trials 3" in proc.stdout, proc.stdout
    assert _in_process(capsys, "optimize", str(path)).returncode == 0
    proc = _in_process(capsys, "audit", str(path))
    assert proc.returncode == 0 and "6 counted of n_trials 6" in proc.stdout, proc.stdout


def test_a_space_shrunk_under_stored_trials_is_refused_naming_them(write_study, tmp_path, capsys):
    """Trials ran over batch sizes 4..160; the space now holds 4..40 only: optimize refuses with
    one line naming trials and values outside it (exit 2), and the study is as it was."""
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=6)
    optimize(load_study(path), printer=lambda _: None)
    stored = len(open_study(load_study(path), create=False).trials)
    space = {
        "batch_size": {"values": [4 * k for k in range(1, 11)]},
        "number_gpus": {"values": [1, 2]},
        "distributed_backend": "DDP",
        "gradient_checkpointing": False,
    }
    path = _study(write_study, tmp_path, faults={"rate": 0.0}, n_trials=8, search_space={"parameters": space})
    proc = _in_process(capsys, "optimize", str(path))
    line = _one_line(proc.stderr)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{path}: search_space:" in line and "lie outside this search space (trial " in line, line
    assert "batch_size=" in line
    assert len(open_study(load_study(path), create=False).trials) == stored
