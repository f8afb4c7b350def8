"""SIGTERM (preemption: Slurm signals the job's process group, Kubernetes the container), SIGINT
(Ctrl-C) and SIGHUP (a terminal hang-up) end a real ``explorer optimize`` the same clean way: the
in-flight trial is marked interrupted, one line says so, the exit status is 128 + the signal, no
Ray or C++ dump reaches the output, no Ray, zygote or rank process is left, and a resume re-runs
the trial and passes the audit.

Each run is a tiny CPU study on a real local Ray whose only trial hangs (an injected ``hang``: its
rank sleeps until the trial timeout), so the trial is still running whenever the signal comes,
however fast or slow the machine; the tests wait for the trial's rank process, not for a time.
"""

from __future__ import annotations

import contextlib
import os
import pty
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from explorer.study import open_study, status_of
from explorer.study._interrupt import Interrupted, StopRequest
from explorer.study_file import load_study
from tests.builders import REPO, run_cli, start_cli


@pytest.fixture(autouse=True)
def sighup_not_ignored():
    """SIGHUP at its default in this process and the ones it starts. Under ``nohup`` it arrives
    ignored, and explorer rightly keeps an ignored SIGHUP ignored (``StopRequest``, Ray's start):
    these tests send SIGHUP and expect it answered."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


START_LIMIT_S = 240.0
"""How long a driver may take to start its trial's rank (Ray, the zygote's imports, on 2 busy cores)."""
DUMP = "SIGTERM received"  # Abseil's failure signal dump, as Ray's core worker wrote it before


def _study(write_study, tmp_path: Path, *, warm_start: bool = True) -> Path:
    """One trial, which hangs; ``warm_start``: its rank forked by the zygote, else under torchrun."""
    return write_study(
        {
            "storage": f"sqlite:///{tmp_path}/s.db",
            "sampler": {"kind": "random", "seed": 0},
            "n_trials": 1,
            "launcher": {"kind": "ray", "warm_start": warm_start},
            "faults": {"schedule": {0: "hang"}, "at_step": 0},  # trial 0 runs until the signal
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4]},
                    "number_gpus": 1,
                    "gradient_checkpointing": {"choices": [False]},
                }
            },
        }
    )


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _rank_started(driver: int, tmp_path: Path) -> bool:
    """Whether the trial's rank runs: a process the driver's zygote forked (warm start), or one
    with the trial's folder in its command line (cold start under torchrun)."""
    tree = _descendants(driver)
    zygotes = set()
    for p in tree:
        with contextlib.suppress(psutil.Error):
            if "explorer.worker.zygote" in p.cmdline():
                zygotes.add(p.pid)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            if p.ppid() in zygotes or str(tmp_path) in " ".join(p.cmdline()):
                return True
    return False


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def _in_group(pgid: int) -> list[psutil.Process]:
    """Live processes of the driver's process group (Ray's, which the driver started)."""
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid:
                out.append(p)
    return _alive(out)


def _assert_nothing_left(snapshot: list[psutil.Process], pgid: int, limit_s: float = 60.0) -> None:
    """Every process the driver had started (``snapshot``, taken while it ran) and every process of
    its group is gone within ``limit_s``; any still there is killed (it is ours) and reported."""
    deadline = time.monotonic() + limit_s
    left = _alive(snapshot) + _in_group(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _alive(snapshot) + _in_group(pgid)
    names = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            names.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            p.kill()
    assert not left, names


def _interrupted_trial(path: Path) -> None:
    trials = open_study(load_study(path), create=False).trials
    trial = next(t for t in trials if t.number == 0)
    assert trial.state.name == "FAIL" and status_of(trial) == "interrupted", (trial.state, trial.user_attrs)
    assert trial.user_attrs.get("injected_fault") == "hang"


class _Lines:
    """A child's merged stdout and stderr, read line by line on a thread."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def until(self, text: str, proc: subprocess.Popen[str], limit_s: float) -> int:
        """Read until a line holding ``text``; returns its index."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            assert line is not None, f"the driver ended (status {proc.wait()}):\n" + "".join(self.lines)
            self.lines.append(line)
            if text in line:
                return len(self.lines) - 1
        raise AssertionError(f"no {text!r} within {limit_s} s:\n" + "".join(self.lines))

    def rest(self) -> list[str]:
        """Every line up to the end of the output (the child has exited)."""
        self._thread.join(timeout=30)
        with contextlib.suppress(queue.Empty):  # a process still holding the pipe: what came so far
            while (line := self._queue.get_nowait()) is not None:
                self.lines.append(line)
        return self.lines


def _stop_a_running_trial(path: Path, tmp_path: Path, signum: int) -> tuple[int, list[str], list[str]]:
    """Start ``explorer optimize`` as its own process group, wait for its trial's rank, send
    ``signum`` to the whole group (as Slurm does, and a terminal's Ctrl-C) and wait for the end.

    Returns:
        The exit status, the whole output, and the output from the trial's start on.
    """
    proc = start_cli("optimize", str(path), new_session=True)
    try:
        out = _Lines(proc.stdout)
        started = out.until("trial 0 started", proc, START_LIMIT_S)
        deadline = time.monotonic() + START_LIMIT_S
        while not _rank_started(proc.pid, tmp_path):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(out.lines)
            time.sleep(0.2)
        snapshot = _descendants(proc.pid)
        os.killpg(proc.pid, signum)
        status = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = out.rest()
    _assert_nothing_left(snapshot, proc.pid)
    return status, lines, lines[started + 1 :]


def test_sigterm_to_the_process_group_marks_the_trial_interrupted_and_the_resume_finishes(
    write_study, tmp_path
):
    """Slurm's preemption: ``kill -TERM -PGID`` reaches the driver and every Ray process at once."""
    path = _study(write_study, tmp_path)
    status, lines, after = _stop_a_running_trial(path, tmp_path, signal.SIGTERM)
    whole = "".join(lines)
    assert status == 128 + signal.SIGTERM == 143, whole
    assert DUMP not in whole and "PC: @" not in whole and "Traceback" not in whole, whole
    assert len(after) <= 3, whole
    assert any("interrupted" in line and "SIGTERM" in line for line in after), whole
    _interrupted_trial(path)

    resumed = run_cli("optimize", str(path), timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rerun = [
        t for t in open_study(load_study(path), create=False).trials if t.user_attrs.get("requeued_from") == 0
    ]
    assert [status_of(t) for t in rerun] == ["ok"], [t.user_attrs for t in rerun]
    audited = run_cli("audit", str(path), timeout=120)
    assert audited.returncode == 0 and "accounting: ok" in audited.stdout, audited.stdout + audited.stderr


def test_ctrl_c_to_the_process_group_exits_130_with_one_line(write_study, tmp_path):
    """A terminal's Ctrl-C signals the foreground process group: the driver and Ray's processes.
    The trial starts cold here: its rank runs under torchrun, in a session of its own."""
    path = _study(write_study, tmp_path, warm_start=False)
    status, lines, after = _stop_a_running_trial(path, tmp_path, signal.SIGINT)
    whole = "".join(lines)
    assert status == 128 + signal.SIGINT == 130, whole
    assert DUMP not in whole and "Traceback" not in whole, whole
    assert len(after) <= 3, whole
    assert any("interrupted" in line and "SIGINT" in line for line in after), whole
    _interrupted_trial(path)


@pytest.mark.slow  # SIGTERM and SIGINT take the same path in the default suite
def test_a_terminal_hang_up_exits_129(write_study, tmp_path):
    """The driver runs on a terminal of its own (a pty, its live footer on); the terminal goes away
    (its other end is closed, as when an SSH session drops): the kernel sends SIGHUP to the driver
    and its process group, and writing to the terminal fails from then on (EIO). Cold start, as
    for Ctrl-C; the SIGTERM test covers the zygote."""
    path = _study(write_study, tmp_path, warm_start=False)
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its controlling terminal
        try:
            os.chdir(REPO)
            os.execv(sys.executable, [sys.executable, "-m", "explorer", "optimize", str(path)])
        finally:
            os._exit(127)  # never back into pytest
    seen = b""
    snapshot: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_LIMIT_S
        while not (b"trial 0 started" in seen and _rank_started(pid, tmp_path)):
            assert time.monotonic() < deadline, seen.decode(errors="replace")[-3000:]
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:  # keep reading: a full pty would block the driver's writes
                try:
                    seen += os.read(fd, 65536)
                except OSError:  # EIO: the driver has ended and closed the terminal
                    raise AssertionError(seen.decode(errors="replace")[-3000:]) from None
        snapshot = _descendants(pid)
    finally:
        os.close(fd)  # the hang-up
    deadline = time.monotonic() + 180
    ended, wait_status = os.waitpid(pid, os.WNOHANG)
    while not ended and time.monotonic() < deadline:
        time.sleep(0.2)
        ended, wait_status = os.waitpid(pid, os.WNOHANG)
    if not ended:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert ended, "the driver did not end after the hang-up"
    assert os.waitstatus_to_exitcode(wait_status) == 128 + signal.SIGHUP == 129
    assert DUMP.encode() not in seen
    _assert_nothing_left(snapshot, pid)
    _interrupted_trial(path)


def test_the_first_signal_is_recorded_a_second_stops_at_once_and_ignored_ones_stay_ignored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with StopRequest() as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs between bytecodes
            assert stop.requested and stop.signum == signal.SIGTERM  # and nothing was raised
            with pytest.raises(Interrupted) as raised:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)
            assert raised.value.signum == signal.SIGTERM  # the signal that stopped the run
            assert isinstance(raised.value, KeyboardInterrupt)
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before[signal.SIGHUP])


def test_once_stopping_another_signal_ends_the_process_at_once(tmp_path):
    """While the loop marks its trials and shuts Ray down, a second signal is not answered by a
    Python handler (which runs only between bytecodes, not inside Ray's C++): the process ends."""
    script = (
        "import os, signal, time\n"
        "from explorer.study._interrupt import StopRequest\n"
        "stop = StopRequest().install()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.2)\n"
        "assert stop.stopping(signal.SIGINT) == signal.SIGTERM  # the first signal is the reason\n"
        "print('stopping', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGHUP)\n"
        "time.sleep(30)\n"
        "print('still here', flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGHUP and proc.stdout == "stopping\n", proc.stdout + proc.stderr


def test_a_signal_while_ray_starts_ends_the_start_and_reaches_the_drivers_handler():
    """``signals_kept`` around ``ray.init`` (the block here; the real start is in the tests above):
    Ray cannot set its own SIGTERM handler inside nor its core worker Abseil's, a signal ends the
    block at once and then goes to the handler the driver had, and the driver's handlers are back
    afterwards."""
    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    from explorer.launch._ray import signals_kept

    setter, abseil = ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    with StopRequest() as stop:
        mine = signal.getsignal(signal.SIGTERM)

        def rays(signum: int, frame: object) -> None:
            raise AssertionError("Ray's handler ran")

        with signals_kept():  # nothing came: a plain block
            ray_utils.set_sigterm_handler(rays)  # what ray.init does
            assert signal.getsignal(signal.SIGTERM) is not rays
            assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is True  # read as the core worker is made
        assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is abseil
        assert signal.getsignal(signal.SIGTERM) == mine and not stop.requested
        with pytest.raises(KeyboardInterrupt), signals_kept():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5.0)  # ended at once, not after this
        assert stop.signum == signal.SIGTERM
        assert {signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)} == {mine}
    assert ray_utils.set_sigterm_handler is setter
