"""Run one trial as a fresh process group and turn whatever happened into a :class:`Measurement`.

This is the code a Ray actor executes; it needs neither Ray nor torch in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from explorer.job import TrialJob
from explorer.launch._command import free_port, trial_command, trial_environment
from explorer.measurement import Measurement, Outcome
from explorer.oom import mentions_oom

__all__ = ["collect", "run_trial"]

LOG_TAIL_CHARS = 8000
TOKEN_VAR = "EXPLORER_TRIAL_TOKEN"
OWNER_VAR = "EXPLORER_OWNER_PID"


def run_trial(job: TrialJob, *, work_dir: Path, runner: str = "torchrun", timeout_s: float) -> Measurement:
    """Start the trial's processes in their own session, wait, and collect the outcome.

    On timeout the whole process group is killed (SIGKILL), so nothing is left behind.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*work_dir.glob("error-rank*.json"), work_dir / "result.json"]:
        stale.unlink(missing_ok=True)
    log_path = work_dir / "train.log"
    cmd = trial_command(job, runner=runner, out_dir=str(work_dir), port=free_port())
    env = trial_environment(job, cpu_count=os.cpu_count() or 1)
    token = uuid.uuid4().hex
    env[TOKEN_VAR] = token  # finds the ranks even after torchrun, which gives each its own session, died
    env[OWNER_VAR] = str(os.getpid())  # ranks exit when this process (the Ray actor) is gone
    started = time.perf_counter()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=work_dir
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_tree(proc.pid, token)
            proc.wait()
    wall = time.perf_counter() - started
    return collect(
        work_dir,
        returncode=proc.returncode,
        timed_out=timeout_s if timed_out else None,
        wall_seconds=wall,
        log_tail=_tail(log_path),
    )


def _kill_tree(pid: int, token: str) -> None:
    """SIGKILL the launcher process, its process group, and every process carrying ``token``.

    torchrun starts each rank in a session of its own, so killing the launcher's group alone
    would leave the ranks running.
    """
    import psutil

    victims: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(pid)
        victims[pid] = root
        victims.update({c.pid: c for c in root.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    for p in psutil.process_iter():
        try:
            if p.environ().get(TOKEN_VAR) == token:
                victims[p.pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for p in victims.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs([p for p in victims.values() if p.pid != pid], timeout=10)


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - LOG_TAIL_CHARS))
        return fh.read().decode("utf-8", errors="replace")


def collect(
    work_dir: Path, *, returncode: int, timed_out: float | None, wall_seconds: float, log_tail: str
) -> Measurement:
    """Classify a finished trial from the files its ranks wrote and its exit status.

    An OOM in any rank makes the trial OOM (the other ranks then fail only as a consequence).
    """
    result = work_dir / "result.json"
    errors = [json.loads(p.read_text()) for p in sorted(work_dir.glob("error-rank*.json"))]
    oom = [e for e in errors if e["outcome"] == Outcome.OOM.value]

    def done(outcome: Outcome, error: str | None, measurement: Measurement | None = None) -> Measurement:
        return Measurement(
            outcome=outcome,
            properties=measurement.properties if measurement else None,
            error=error,
            wall_seconds=wall_seconds,
            log_tail=log_tail,
            extra=measurement.extra if measurement else {},
        )

    if oom:
        return done(Outcome.OOM, f"rank {oom[0]['rank']}: {oom[0]['error']}")
    if timed_out is not None:
        return done(Outcome.FAILED, f"timed out after {timed_out:.0f} s; the process group was killed")
    if errors:
        return done(Outcome.FAILED, f"rank {errors[0]['rank']}: {errors[0]['error']}")
    if returncode == 0 and result.is_file():
        return done(Outcome.OK, None, Measurement.from_json(result.read_text()))
    if mentions_oom(log_tail):
        return done(Outcome.OOM, "out of memory (from the process output)")
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    return done(Outcome.FAILED, f"training processes ended with {how} and reported nothing")
