"""The warm start: ranks forked from a zygote that already imported torch and transformers.

Real processes throughout: a real zygote, real forked ranks training on gloo, real kills.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from explorer.launch import ensure_zygote, run_trial, zygote_environment
from explorer.launch._warm import kill_ranks, spawn_rank
from explorer.measurement import Outcome


def _zygote_process(sock) -> psutil.Process:
    """The zygote serving ``sock`` (its forked ranks share its command line, not its parent)."""
    same = [p for p in psutil.process_iter(["cmdline"]) if str(sock) in (p.info["cmdline"] or [])]
    pids = {p.pid for p in same}
    (proc,) = [p for p in same if p.ppid() not in pids]
    return proc


@pytest.mark.slow  # two real trial starts
def test_an_oom_fails_the_same_warm_and_cold(make_job, tmp_path):
    """An OOM configuration is classified alike whether it starts warm (forked from the zygote)
    or cold. How much sooner it fails warm is a speed figure: benchmarks/warm_vs_cold.py."""
    job = make_job(batch_size=512, number_gpus=1, distributed_backend="NONE")
    sock = ensure_zygote(owner_pid=os.getpid(), env=zygote_environment(cpu_count=os.cpu_count() or 1))
    warm = run_trial(job, work_dir=tmp_path / "warm", timeout_s=240, warm_start=True, zygote=sock)
    cold = run_trial(job, work_dir=tmp_path / "cold", timeout_s=240, warm_start=False)
    assert warm.outcome is Outcome.OOM and cold.outcome is Outcome.OOM
    assert warm.extra["start"] == "warm" and cold.extra["start"] == "cold"


def test_a_rank_dies_when_its_client_hangs_up(make_job, tmp_path):
    """A Ray actor that dies mid-trial closes its connections; the zygote then kills the rank."""
    job = make_job(
        {"measurement": {"stop": "seconds", "stop_after_seconds": 120, "trial_timeout_s": 240}},
        batch_size=4,
        number_gpus=1,
        distributed_backend="NONE",
    )
    sock = ensure_zygote(owner_pid=os.getpid(), env=zygote_environment(cpu_count=1))
    rank = spawn_rank(
        sock,
        argv=["--job", job.to_json(), "--out", str(tmp_path)],
        env={"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
        log=tmp_path / "train.log",
    )
    proc = psutil.Process(rank.pid)
    assert proc.is_running() and proc.ppid() == _zygote_process(sock).pid
    rank.conn.close()
    gone, alive = psutil.wait_procs([proc], timeout=10)
    assert alive == [] and gone
    kill_ranks([])  # nothing left to kill


def test_the_zygote_exits_with_its_owner(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        sock = ensure_zygote(owner_pid=owner.pid, env=zygote_environment(cpu_count=1))
        zygote = _zygote_process(sock)
        assert ensure_zygote(owner_pid=owner.pid, env={}) == sock  # reused, not started again
    finally:
        owner.kill()
        owner.wait()
    gone, alive = psutil.wait_procs([zygote], timeout=15)
    assert alive == [] and not sock.exists()


def test_a_second_owner_gets_a_zygote_of_its_own():
    a = ensure_zygote(owner_pid=os.getpid(), env=zygote_environment(cpu_count=1))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        b = ensure_zygote(owner_pid=other.pid, env=zygote_environment(cpu_count=1))
        assert a != b and _zygote_process(a).pid != _zygote_process(b).pid
    finally:
        other.kill()
        other.wait()


@pytest.mark.usefixtures("ray_local")
def test_ray_trials_start_warm_on_every_node(write_study, tmp_path):
    """Through the launcher: a ZygoteHost actor per node, and each trial's ranks forked from it."""
    from explorer.job import TrialJob
    from explorer.launch import RayLauncher
    from explorer.study_file import load_study
    from explorer.trial_config import TrialConfig

    loaded = load_study(write_study({}))
    launcher = RayLauncher.for_study(loaded.spec, output_dir=tmp_path)
    launcher.start()
    try:
        config = TrialConfig(
            batch_size=4,
            number_gpus=2,
            distributed_backend="DDP",
            gradient_checkpointing=False,
            model_max_length=64,
        )
        launcher.submit(TrialJob.for_study(loaded, config, trial_number=1))
        deadline = time.monotonic() + 300
        done = []
        while not done and time.monotonic() < deadline:
            done = launcher.wait(5)
        ((number, m),) = done
        assert number == 1 and m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
        assert m.extra["start"] == "warm"
    finally:
        launcher.shutdown()


def test_a_rank_that_ends_is_reported_at_once(tmp_path):
    """The zygote reaps on SIGCHLD through a wakeup fd; a signal handler alone would not wake its
    select() (PEP 475 retries it), and every trial would wait for the next 0.5 s poll."""
    from explorer.launch._warm import wait_ranks

    sock = ensure_zygote(owner_pid=os.getpid(), env=zygote_environment(cpu_count=1))
    latencies = []
    for i in range(8):
        started = time.perf_counter()
        rank = spawn_rank(
            sock,
            argv=["--job", "{}", "--out", str(tmp_path)],  # not a job: the rank fails at once
            env={"PATH": os.environ["PATH"]},
            cwd=tmp_path,
            log=tmp_path / f"rank{i}.log",
        )
        code, timed_out = wait_ranks([rank], timeout_s=30)
        latencies.append(time.perf_counter() - started)
        rank.conn.close()
        assert code != 0 and not timed_out
    assert max(latencies) < 0.25, latencies  # 0.5 s polling: all 8 under 0.25 s by chance ~0.4%


@pytest.fixture
def fake_cuda_zygote(tmp_path, monkeypatch):
    """The zygote environment with a fake CUDA: a ``sitecustomize`` in the zygote alone makes torch
    report a poisoned fork (the state a CUDA build enters after an import asks the device) from
    the moment its ``when`` expression holds, since this machine has no CUDA. This process's zygote
    is stopped before and after, so that neither another test's zygote nor this one is shared."""
    from explorer.launch._warm import _key, _zygote_dir
    from explorer.worker._zygote import answers

    sock = _zygote_dir() / f"zygote-{_key(os.getpid())}.sock"

    def stop() -> None:
        if answers(sock):
            zygote = _zygote_process(sock)
            zygote.kill()
            zygote.wait(30)

    def _env(when: str) -> dict[str, str]:
        fake = tmp_path / "fake-cuda"
        fake.mkdir()
        (fake / "sitecustomize.py").write_text(
            f"import sys\n\nimport torch\n\ntorch.cuda._is_in_bad_fork = lambda: {when}  # FAKE CUDA\n"
        )
        env = zygote_environment(cpu_count=1)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake), env.get("PYTHONPATH")]))
        return env

    stop()
    monkeypatch.setattr("explorer.launch._warm._COLD", {})  # this process's verdicts, this test only
    yield _env
    stop()


@pytest.mark.slow  # a real zygote start and a cold trial start
def test_a_zygote_whose_imports_leave_cuda_unusable_in_a_fork_sends_ranks_cold(
    make_job, tmp_path, fake_cuda_zygote
):
    """On CUDA, an import that initialises CUDA (or asks its device count) in the zygote makes every
    forked rank fail with "Cannot re-initialize CUDA in forked subprocess". The zygote checks with a
    forked probe after each import; where the first import does it, the zygote says so and the
    trials start cold."""
    from explorer.launch._warm import cold_reason

    assert ensure_zygote(owner_pid=os.getpid(), env=fake_cuda_zygote("True")) is None
    assert (
        cold_reason(os.getpid())
        == "importing torch.distributed initialised CUDA, so a forked rank could not use it"
    )
    m = run_trial(
        make_job(batch_size=4, number_gpus=1), work_dir=tmp_path / "t", timeout_s=240, warm_start=True
    )
    assert m.outcome is Outcome.OK, m.error
    assert m.extra["start"] == "cold"


@pytest.mark.slow  # a real zygote start, again, and a warm trial
def test_a_zygote_keeps_the_imports_before_the_one_that_leaves_cuda_unusable(
    make_job, tmp_path, fake_cuda_zygote
):
    """Where a later import (here transformers) leaves CUDA unusable in a fork, the zygote starts
    afresh with the imports before it: ranks still start warm and import the rest themselves."""
    from explorer.launch._warm import _key, _zygote_dir, cold_reason

    sock = ensure_zygote(owner_pid=os.getpid(), env=fake_cuda_zygote("'transformers' in sys.modules"))
    assert sock is not None and cold_reason(os.getpid()) is None
    log = (_zygote_dir() / f"zygote-{_key(os.getpid())}.log").read_text()
    assert "importing transformers initialised CUDA; ranks import it themselves" in log
    assert "--upto 2" in " ".join(_zygote_process(sock).cmdline())
    job = make_job(batch_size=4, number_gpus=1)
    m = run_trial(job, work_dir=tmp_path / "t", timeout_s=240, warm_start=True, zygote=sock)
    assert m.outcome is Outcome.OK, m.error
    assert m.extra["start"] == "warm"
