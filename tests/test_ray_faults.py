"""Faults of the local Ray explorer starts, on real Ray processes killed by pid during a real
``explorer optimize`` (the CLI, the tiny model on 2 logical GPUs): a dead raylet or GCS ends the run
(its trials interrupted, one line, a non-zero status, nothing left running, a resume measures them),
a stopped trial actor is killed at its deadline, and every server of that Ray listens on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from explorer.record import TrialRecord

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "explorer"]


def _study(write_study: Any, tmp_path: Path, **patch: Any) -> Path:
    """Two one-node trials (1 and 2 GPUs) on the local Ray, each training 10 s."""
    base: dict[str, Any] = {
        "storage": f"sqlite:///{tmp_path}/s.db",
        "output_dir": str(tmp_path / "runs"),
        "n_trials": 2,
        "sampler": {"kind": "grid"},
        "launcher": {"warm_start": False, "max_retries": 1},
        "measurement": {"stop": "seconds", "stop_after_seconds": 10, "trial_timeout_s": 120},
        "search_space": {
            "parameters": {
                "batch_size": {"values": [4]},
                "number_gpus": {"values": [1, 2]},
                "distributed_backend": {"choices": ["DDP"]},
                "gradient_checkpointing": {"choices": [False]},
            }
        },
    }
    base.update(patch)
    return write_study(base)


@contextlib.contextmanager
def _driver(path: Path, tmp_path: Path, name: str) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """``explorer optimize PATH`` with its stdout and stderr in files; killed if still running."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen([*CLI, "optimize", str(path)], cwd=REPO, stdout=o, stderr=e)
    try:
        yield proc, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _named(procs: list[psutil.Process], needle: str) -> list[psutil.Process]:
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if needle in " ".join([proc.name(), *proc.cmdline()]):
                found.append(proc)
    return found


def _until_training(driver: subprocess.Popen[bytes], out: Path, err: Path, limit_s: float = 180) -> None:
    """Wait until a trial's ranks train under the driver's Ray."""
    deadline = time.monotonic() + limit_s
    while not _named(_tree(driver.pid), "explorer.worker"):
        assert driver.poll() is None, out.read_text() + err.read_text()
        assert time.monotonic() < deadline, out.read_text() + err.read_text()
        time.sleep(0.5)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
    return left


def _trials(tmp_path: Path) -> list[Any]:
    import optuna

    return optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path}/s.db").get_trials()


@pytest.mark.slow  # two real optimize runs with a local Ray each: about 2 minutes here
@pytest.mark.parametrize(("victim", "name"), [("raylet", "raylet"), ("gcs_server", "GCS")])
def test_a_dead_local_ray_ends_the_run_and_the_resume_measures_its_trials(
    write_study, tmp_path, victim, name
):
    """The local Ray's raylet (or GCS) is SIGKILLed while a trial trains. No trial is failed for
    it: the run ends at once with one line and status 1, the trial in flight is interrupted, no
    Ray process (worker, agent, raylet) is left, and ``explorer optimize`` again measures it.

    Before: a dead raylet failed the trial in flight ("actor died"), then every other trial in no
    time ("cannot place ... no such GPUs"), exit 0; a dead GCS stalled the driver 60 s until Ray's
    core ended it, the trial left RUNNING and Ray's workers alive for minutes."""
    path = _study(write_study, tmp_path)
    with _driver(path, tmp_path, "first") as (driver, out, err):
        _until_training(driver, out, err)
        time.sleep(2)  # training
        ray_procs = _tree(driver.pid)
        (target,) = [p for p in ray_procs if p.name() == victim]
        for raylet in [p for p in ray_procs if p.name() == "raylet"]:  # its workers, by their parent
            ray_procs += _tree(raylet.pid)
        killed = time.monotonic()
        os.kill(target.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        took = time.monotonic() - killed
    said_out, said_err = out.read_text(), err.read_text()
    print(said_out + said_err)
    assert driver.returncode == 1, said_out + said_err
    assert took < 30, f"{took:.0f} s to end the run"  # Ray's core would end it after 60 s
    (line,) = said_err.strip().splitlines()  # one line, not Ray's messages nor a traceback
    assert line.startswith(f"explorer: error: RayLost: the local Ray's {name} (pid {target.pid})"), line
    assert "killed by SIGKILL" in line and "marked interrupted" in line and "resume" in line, line
    assert not [x for x in said_out.splitlines() if "trial" in x and " failed" in x], said_out

    trials = _trials(tmp_path)
    statuses = [TrialRecord.of(t).status for t in trials]
    assert "failed" not in statuses and "interrupted" in statuses, statuses
    assert not [t for t in trials if t.state.name == "RUNNING"]

    deadline = time.monotonic() + 15  # the zygote and ranks notice their owner is gone
    while _alive(ray_procs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(ray_procs), [(p.pid, p.name()) for p in _alive(ray_procs)]

    # the resume's trials train 3 s: the first run's 10 s only kept a trial training when its Ray
    # process was killed (the study file is read anew by each run; its job is unchanged)
    measurement = {"stop": "seconds", "stop_after_seconds": 3, "trial_timeout_s": 120}
    path = _study(write_study, tmp_path, measurement=measurement)
    with _driver(path, tmp_path, "resume") as (again, out, err):
        again.wait(timeout=300)
    assert again.returncode == 0, out.read_text() + err.read_text()
    trials = _trials(tmp_path)
    ok = [t for t in trials if TrialRecord.of(t).status == "ok"]
    assert sorted(TrialRecord.of(t).number_gpus for t in ok) == [1, 2], [t.user_attrs for t in trials]
    assert any(TrialRecord.of(t).requeued_from is not None for t in ok)


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _listening(procs: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every socket ``procs`` listen on."""
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((proc.name(), conn.laddr.ip, conn.laddr.port))
    return found


@pytest.mark.slow  # one real optimize with a local Ray: about a minute here
def test_the_local_ray_listens_on_loopback_only(write_study, tmp_path):
    """While a trial trains, every socket the local Ray's processes listen on (GCS, raylet, its
    agents with the metrics endpoint, the autoscaler monitor, the workers) is on 127.0.0.1.
    Before: the GCS, raylet and workers on every interface (``::``), the dashboard agent's HTTP
    and metrics servers on the machine's address and 0.0.0.0."""
    path = _study(write_study, tmp_path, n_trials=1, launcher={"warm_start": True})
    with _driver(path, tmp_path, "run") as (driver, out, err):
        _until_training(driver, out, err)
        time.sleep(3)  # every agent is up by now
        procs = _tree(driver.pid)
        for raylet in [p for p in procs if p.name() == "raylet"]:
            procs += _tree(raylet.pid)
        ranks = {p.pid for p in _named(procs, "explorer.worker")}
        ray_procs = [p for p in procs if p.pid not in ranks]
        sockets = _listening(ray_procs)
        driver.wait(timeout=300)
    print(sockets)
    assert driver.returncode == 0, out.read_text() + err.read_text()
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # the listing sees Ray's servers
    assert any(name.startswith("ray::") for name in names), sockets  # and its workers
    outward = [s for s in sockets if s[1] not in LOOPBACK]
    assert not outward, outward


def _stop_the_first(needle: str, stopped: list[int], until: float) -> None:
    """SIGSTOP the first process under this one whose name holds ``needle`` (a thread's work)."""
    while time.monotonic() < until and not stopped:
        for proc in _named(_tree(os.getpid()), needle):
            os.kill(proc.pid, signal.SIGSTOP)
            stopped.append(proc.pid)
            return
        time.sleep(0.2)


@pytest.mark.slow  # a real optimize that waits out a trial's deadline: about a minute here
def test_a_stopped_trial_actor_is_killed_at_its_deadline_and_the_trial_fails_in_one_line(
    write_study, tmp_path
):
    """The trial's ``ray::TrialActor`` is SIGSTOPped as soon as it starts (trial timeout 20 s). The
    driver kills it at the trial's timeout plus the launcher's grace (10 s here; 120 s by default)
    and the trial fails with one plain line. Before: a one-node trial had no deadline in the
    driver, which waited as long as the actor stayed stopped (6 minutes, observed)."""
    import threading

    from explorer.launch import RayLauncher
    from explorer.study import optimize
    from explorer.study_file import load_study

    measurement = {"stop": "seconds", "stop_after_seconds": 5, "trial_timeout_s": 20}
    path = _study(
        write_study,
        tmp_path,
        n_trials=1,
        measurement=measurement,
        launcher={"warm_start": False, "max_retries": 0},
    )
    loaded = load_study(path)
    launcher = RayLauncher.for_study(loaded.spec, output_dir=loaded.output_dir)
    launcher.grace_s = 10.0
    stopped: list[int] = []
    watcher = threading.Thread(target=_stop_the_first, args=("TrialActor", stopped, time.monotonic() + 120))
    watcher.start()
    started = time.monotonic()
    try:
        optimize(loaded, launcher=launcher, printer=print)
        took = time.monotonic() - started
        watcher.join()
        assert stopped, "no trial actor was seen"
        deadline = time.monotonic() + 15
        while psutil.pid_exists(stopped[0]) and _alive([psutil.Process(stopped[0])]):
            assert time.monotonic() < deadline, "the stopped actor was not killed"
            time.sleep(0.5)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        launcher.shutdown()
    (record,) = [r for r in map(TrialRecord.of, _trials(tmp_path)) if r.status is not None]
    assert record.status == "failed", record.error
    assert record.error == "no answer within 20 s (the trial's timeout) + 10 s: its Ray actor was killed"
    assert took < 20 + 10 + 90, f"{took:.0f} s"  # the deadline, plus Ray's start and the trial's


def test_a_ray_error_is_stored_as_one_plain_line(ray_local):
    """Ray's errors from a real actor: a task that raised is its exception's line (not Ray's
    coloured ``ray::A.f() (pid=...)`` header); an actor that died says how, without colour codes."""
    from explorer.launch._ray_messages import error_line

    ray = ray_local

    @ray.remote(num_cpus=0)
    class A:
        def boom(self) -> None:
            raise ValueError("the cause\nand more")

        def pid(self) -> int:
            return os.getpid()

    actor = A.remote()
    with pytest.raises(ray.exceptions.RayTaskError) as raised:
        ray.get(actor.boom.remote())
    assert "\x1b[" in str(raised.value)  # Ray colours its header: the test sees what was stored
    assert error_line(raised.value) == "ValueError: the cause"
    ray.kill(actor, no_restart=True)
    # ray.kill goes through Ray's control store while a call goes straight to the actor, so a
    # call made just after the kill can still be answered: ask until the actor's death shows.
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(actor.pid.remote(), timeout=30)
        except ray.exceptions.RayActorError as error:
            died = error
            break
        assert time.monotonic() < deadline, "the killed actor still answers"
        time.sleep(0.1)
    line = error_line(died)
    assert "\x1b" not in line and "\n" not in line and "actor" in line.lower(), line
