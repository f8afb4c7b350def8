"""The warm start leaves no files behind: a zygote that ends removes its socket, lock and empty
log, and the next start sweeps what a killed one left (``$TMPDIR/explorer-<uid>`` held 76 stale
sockets after a day of runs)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from explorer.launch import ensure_zygote, zygote_environment
from explorer.launch._warm import sweep
from explorer.worker._zygote import remove_files


@pytest.fixture
def tmpdir_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _owner() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _zygote(sock: Path) -> psutil.Process:
    same = [p for p in psutil.process_iter(["cmdline"]) if str(sock) in (p.info["cmdline"] or [])]
    pids = {p.pid for p in same}
    (proc,) = [p for p in same if p.ppid() not in pids]
    return proc


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.slow  # starts a real zygote (it imports torch and transformers first)
def test_a_zygote_that_ends_leaves_no_file(tmpdir_: Path) -> None:
    owner = _owner()
    try:
        sock = ensure_zygote(owner_pid=owner.pid, env=zygote_environment(cpu_count=1))
        zygote = _zygote(sock)
        assert {p.suffix for p in sock.parent.iterdir()} >= {".sock", ".lock"}
    finally:
        owner.kill()
        owner.wait()
    psutil.wait_procs([zygote], timeout=15)
    assert _files(sock.parent) == []


@pytest.mark.slow  # starts two real zygotes
def test_the_next_start_sweeps_what_a_killed_zygote_left(tmpdir_: Path) -> None:
    first, second = _owner(), _owner()
    try:
        sock = ensure_zygote(owner_pid=first.pid, env=zygote_environment(cpu_count=1))
        zygote = _zygote(sock)
        zygote.kill()  # SIGKILL: no clean-up of its own
        psutil.wait_procs([zygote], timeout=15)
        assert sock.exists() and sock.with_suffix(".lock").exists()
        other = ensure_zygote(owner_pid=second.pid, env=zygote_environment(cpu_count=1))
        assert other != sock, _files(sock.parent)
        # the live zygote's socket, lock and log (empty until it ends) alone
        assert set(_files(sock.parent)) <= {other.name, other.stem + ".lock", other.stem + ".log"}
        assert not sock.exists() and not sock.with_suffix(".lock").exists()
        # a live zygote is never swept
        assert sweep(sock.parent) == 0 and other.exists()
    finally:
        for owner in (first, second):
            owner.kill()
            owner.wait()


def test_files_a_starter_holds_are_left_alone(tmp_path: Path) -> None:
    sock = tmp_path / "zygote-abc.sock"
    sock.touch()  # no zygote answers on it
    with sock.with_suffix(".lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a starter is starting it right now
        assert remove_files(sock) is False and sock.exists()
    assert remove_files(sock) is True and _files(tmp_path) == []
