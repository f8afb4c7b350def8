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
from explorer.launch._command import (
    Rendezvous,
    free_port,
    rank_environments,
    trial_command,
    trial_environment,
    worker_argv,
    zygote_environment,
)
from explorer.measurement import Measurement, Outcome
from explorer.oom import HOST_OOM, host_oom_kills, last_error_line, mentions_oom

__all__ = ["RANK_RECORD_GLOB", "collect", "rank_records", "run_trial"]

LOG_TAIL_CHARS = 8000
_WRITTEN = ("train.log", "result.json", "result.tmp")
"""Files of a trial folder written in place (the rest are written beside and renamed over)."""
TOKEN_VAR = "EXPLORER_TRIAL_TOKEN"
OWNER_VAR = "EXPLORER_OWNER_PID"
RANK_RECORD_GLOB = "rank-*.json"
"""Each rank writes ``rank-<RANK>.json`` (where it ran) when it starts; see :mod:`explorer.worker`."""


def run_trial(
    job: TrialJob,
    *,
    work_dir: Path,
    runner: str = "torchrun",
    timeout_s: float,
    warm_start: bool = False,
    zygote: Path | None = None,
    rendezvous: Rendezvous | None = None,
    node_env: dict[str, str] | None = None,
) -> Measurement:
    """Start the trial's processes in their own sessions, wait, and collect the outcome.

    With ``warm_start`` (and one node, and torchrun or a single process), the ranks are forked
    from this node's zygote (``zygote``: its socket; ``None``: one owned by this process), which
    has already imported torch and transformers; otherwise they
    start as fresh interpreters under python, torchrun or accelerate launch. Either way, on
    timeout every process of the trial is killed (SIGKILL), so nothing is left behind.

    A multi-node trial runs this once per node, each with its ``rendezvous`` (always a cold
    start); only node 0 holds global rank 0, so only its measurement has the properties, and a
    clean exit of another node is ``ok`` without them. ``node_env`` (``EXPLORER_*`` variables such
    as the Ray node id) reaches every rank, which records it in its ``rank-<RANK>.json``; the
    records come back in ``extra["ranks"]``.

    A trial folder that resolves outside its parent (the study's output folder), or a file in it
    written in place that resolves outside the folder (a symlink), is not followed: the trial
    fails with that reason and nothing is written (:mod:`explorer.paths`).
    """
    from explorer.paths import escape

    problem = escape(work_dir.parent, work_dir) or next(
        filter(None, (escape(work_dir, work_dir / name) for name in _WRITTEN)), None
    )
    if problem is not None:
        return Measurement(outcome=Outcome.FAILED, error=f"trial folder: {problem}")
    work_dir.mkdir(parents=True, exist_ok=True)
    stale_files = [*work_dir.glob("error-rank*.json"), *work_dir.glob(RANK_RECORD_GLOB)]
    for stale in [*stale_files, work_dir / "result.json"]:
        stale.unlink(missing_ok=True)
    log_path = work_dir / "train.log"
    log_path.write_bytes(b"")
    env = {**trial_environment(job, cpu_count=os.cpu_count() or 1), **(node_env or {})}
    env[OWNER_VAR] = str(os.getpid())  # ranks exit when this process (the Ray actor) is gone
    n = job.config.number_gpus
    single_node = job.config.number_nodes == 1 and rendezvous is None
    warm = warm_start and single_node and (n == 1 or runner == "torchrun")
    if warm and zygote is None:  # this process's own zygote; none where it cannot fork ranks
        from explorer.launch._warm import ensure_zygote

        zygote = ensure_zygote(owner_pid=os.getpid(), env=zygote_environment(cpu_count=os.cpu_count() or 1))
        warm = zygote is not None
    oom_kills = host_oom_kills()  # the kernel's, for the cgroup the trial's processes start in
    started = time.perf_counter()
    if warm and zygote is not None:
        returncode, timed_out = _run_warm(job, work_dir, log_path, env, timeout_s, zygote)
    else:
        returncode, timed_out = _run_cold(job, work_dir, log_path, env, runner, timeout_s, rendezvous)
    wall = time.perf_counter() - started
    after = host_oom_kills()
    measurement = collect(
        work_dir,
        returncode=returncode,
        timed_out=timeout_s if timed_out else None,
        wall_seconds=wall,
        log_tail=_tail(log_path),
        expects_result=rendezvous is None or rendezvous.node_rank == 0,
        host_oom_killed=oom_kills is not None and after is not None and after > oom_kills,
    )
    measurement.extra["start"] = "warm" if warm else "cold"
    measurement.extra["log_file"] = str(log_path.resolve())  # every rank's full output
    measurement.extra["ranks"] = rank_records(work_dir)
    return measurement


def rank_records(work_dir: Path) -> list[dict[str, object]]:
    """The ``rank-<RANK>.json`` records the ranks of one node wrote in ``work_dir``, by rank."""
    records = []
    for path in work_dir.glob(RANK_RECORD_GLOB):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # a rank killed while writing it: the record is lost, not the trial
            continue
    return sorted(records, key=lambda r: int(r.get("rank", 0)))


def _run_cold(
    job: TrialJob,
    work_dir: Path,
    log_path: Path,
    env: dict[str, str],
    runner: str,
    timeout_s: float,
    rendezvous: Rendezvous | None,
) -> tuple[int, bool]:
    cmd = trial_command(job, runner=runner, out_dir=str(work_dir), port=free_port(), rendezvous=rendezvous)
    token = uuid.uuid4().hex
    env = {
        **env,
        TOKEN_VAR: token,
    }  # finds the ranks even after torchrun, which gives each its own session, died
    with log_path.open("ab") as log:
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
    return proc.returncode, timed_out


def _run_warm(
    job: TrialJob,
    work_dir: Path,
    log_path: Path,
    env: dict[str, str],
    timeout_s: float,
    sock: Path,
) -> tuple[int, bool]:
    from explorer.launch._warm import kill_ranks, spawn_rank, wait_ranks

    argv = worker_argv(job, out_dir=str(work_dir))
    ranks = []
    try:
        for rank_env in rank_environments(
            env, world_size=job.config.number_gpus, port=free_port(), process_group=job.config.process_group
        ):
            ranks.append(spawn_rank(sock, argv=argv, env=rank_env, cwd=work_dir, log=log_path))
        return wait_ranks(ranks, timeout_s=timeout_s)
    finally:
        kill_ranks(ranks)


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
    work_dir: Path,
    *,
    returncode: int,
    timed_out: float | None,
    wall_seconds: float,
    log_tail: str,
    expects_result: bool = True,
    host_oom_killed: bool = False,
) -> Measurement:
    """Classify a finished trial from the files its ranks wrote and its exit status.

    An OOM in any rank makes the trial OOM (the other ranks then fail only as a consequence), and
    so does ``host_oom_killed``: the kernel killed a process of the trial's cgroup for its memory
    limit while the trial ran (the killed rank wrote nothing; its peers fail only as a consequence),
    unless the trial finished with its result all the same.
    ``expects_result=False`` (a node of a multi-node trial other than node 0): a clean exit with
    no ``result.json`` is ``ok`` without properties (global rank 0 measured on node 0).
    """
    result = work_dir / "result.json"
    errors = [json.loads(p.read_text()) for p in sorted(work_dir.glob("error-rank*.json"))]
    oom = [e for e in errors if e["outcome"] == Outcome.OOM.value]

    def done(outcome: Outcome, error: str | None, measurement: Measurement | None = None) -> Measurement:
        extra = dict(measurement.extra) if measurement else {}
        first = (oom or errors or [{}])[0]
        if "phases" in first:  # where the failing rank's time went
            extra["phases"] = first["phases"]
        return Measurement(
            outcome=outcome,
            properties=measurement.properties if measurement else None,
            error=error,
            wall_seconds=wall_seconds,
            log_tail=log_tail,
            extra=extra,
        )

    if oom:
        return done(Outcome.OOM, f"rank {oom[0]['rank']}: {oom[0]['error']}")
    if host_oom_killed and not (returncode == 0 and result.is_file()):
        return done(Outcome.OOM, HOST_OOM)
    if timed_out is not None:
        return done(Outcome.FAILED, f"timed out after {timed_out:.0f} s; the process group was killed")
    if errors:
        return done(Outcome.FAILED, f"rank {errors[0]['rank']}: {errors[0]['error']}")
    if returncode == 0 and result.is_file():
        return done(Outcome.OK, None, Measurement.from_json(result.read_text()))
    if returncode == 0 and not expects_result:
        return done(Outcome.OK, None)
    if mentions_oom(log_tail):
        return done(Outcome.OOM, "out of memory (from the process output)")
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    said = last_error_line(log_tail)
    return done(
        Outcome.FAILED,
        f"training processes ended with {how} and reported nothing"
        + (f"; the log says: {said}" if said else ""),
    )
