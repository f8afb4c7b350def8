"""A trial process the kernel kills for its cgroup's memory limit (the host's limit: Slurm's, a
container's; not explorer's own cap) is out of memory, named as such: a real trial in a real
memory cgroup made for the test, and the cgroup files' formats (v1 and v2) read from real files."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from explorer.measurement import Measurement, Outcome
from explorer.oom import HOST_OOM, host_oom_kills

REPO = Path(__file__).resolve().parents[1]

RUN_IN_GROUP = """
import sys
from pathlib import Path
from explorer.job import TrialJob
from explorer.launch import run_trial

group, job_file, work_dir = sys.argv[1:]
Path(group, "cgroup.procs").write_text(str(__import__("os").getpid()))  # the trial starts in it
job = TrialJob.from_json(Path(job_file).read_text())
print(run_trial(job, work_dir=Path(work_dir), timeout_s=240, warm_start=False).to_json())
"""


def _own_group(controller_line: str, mount: Path) -> Path:
    path = controller_line.split(":", 2)[2].strip()
    return mount / path.lstrip("/")


def _new_memory_cgroup(limit_bytes: int) -> tuple[Path, str]:
    """A child of this process's memory cgroup with ``limit_bytes`` of memory (no swap): its
    folder, and the file that holds its ``oom_kill`` count. Skips where none can be made."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line for line in lines if "memory" in line.split(":")[1].split(",")]
    v2 = [line for line in lines if line.startswith("0::")]
    name = f"explorer-test-{uuid.uuid4().hex[:8]}"
    if v1 and Path("/sys/fs/cgroup/memory").is_dir():
        group, events = _own_group(v1[0], Path("/sys/fs/cgroup/memory")) / name, "memory.oom_control"
        limits = {"memory.limit_in_bytes": limit_bytes, "memory.memsw.limit_in_bytes": limit_bytes}
    elif v2 and "memory" in Path("/sys/fs/cgroup/cgroup.controllers").read_text().split():
        group, events = _own_group(v2[0], Path("/sys/fs/cgroup")) / name, "memory.events"
        limits = {"memory.max": limit_bytes, "memory.swap.max": 0}
    else:
        pytest.skip("no memory cgroup controller on this machine")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here ({exc.strerror}); the formats are tested below")
    for key, value in limits.items():
        limit = group / key
        if limit.exists():
            limit.write_text(str(value))
    return group, events


def _oom_kills(text: str) -> int:
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("oom_kill ")))


@pytest.mark.slow  # a real 2-rank trial started in a 384 MiB cgroup: about 20 s here
def test_a_rank_killed_by_the_hosts_memory_limit_is_out_of_memory(make_job, tmp_path):
    """A 2-rank DDP trial (torchrun, fresh interpreters) starts in a cgroup limited to 384 MiB:
    the kernel SIGKILLs a process of it when it imports torch. The trial is OOM (infeasible,
    learned), its error says the host's memory limit killed it. Before: "training processes ended
    with killed by signal 9 and reported nothing", FAILED, retried."""
    group, events = _new_memory_cgroup(384 << 20)
    job_file = tmp_path / "job.json"
    job_file.write_text(make_job(batch_size=4, number_gpus=2, distributed_backend="DDP").to_json())
    try:
        ran = subprocess.run(
            [sys.executable, "-c", RUN_IN_GROUP, str(group), str(job_file), str(tmp_path / "trial")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        kills = _oom_kills((group / events).read_text())
    finally:
        group.rmdir()
    assert ran.returncode == 0, ran.stderr[-3000:]
    measurement = Measurement.from_json(ran.stdout.strip().splitlines()[-1])
    assert kills >= 1  # the kernel did kill for the limit (else the test proves nothing)
    assert measurement.outcome is Outcome.OOM, (measurement.error, measurement.log_tail[-1500:])
    assert measurement.error == HOST_OOM == "killed by the host's memory limit (cgroup OOM kill)"


def _proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    return proc


def test_the_oom_kill_count_is_read_from_cgroup_v2_and_v1_files(tmp_path):
    """The files as the kernel writes them: cgroup v2's ``memory.events`` under the unified mount
    (a container's mount root taken off the path), v1's ``memory.oom_control`` under the memory
    controller's mount; none readable: ``None``."""
    v2 = tmp_path / "v2"
    (v2 / "step").mkdir(parents=True)  # /job/step, in a hierarchy mounted from /job
    (v2 / "step" / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    mountinfo = (
        f"30 25 0:26 /job {v2} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
        f"31 25 0:27 / {tmp_path}/v1 rw,nosuid - cgroup cgroup rw,cpu\n"
    )
    proc = _proc(tmp_path, "0::/job/step\n", mountinfo)
    assert host_oom_kills(proc=proc) == 2

    v1 = tmp_path / "v1mem" / "slurm" / "uid_0" / "job_7"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    mountinfo = f"40 25 0:35 / {tmp_path}/v1mem rw,nosuid - cgroup cgroup rw,memory\n"
    proc = _proc(tmp_path / "b", "12:pids:/slurm\n4:memory:/slurm/uid_0/job_7\n0::/\n", mountinfo)
    assert host_oom_kills(proc=proc) == 5

    proc = _proc(tmp_path / "c", "0::/\n", mountinfo)  # no v2 mount, no memory line: no count
    assert host_oom_kills(proc=proc) is None


def test_a_rise_of_the_count_makes_a_silent_sigkill_out_of_memory(tmp_path):
    """A trial whose processes ended by SIGKILL with nothing written: out of memory when the count
    rose while it ran, else the failure it always was; a finished trial stays ok."""
    from explorer.launch import collect

    killed = collect(
        tmp_path, returncode=-9, timed_out=None, wall_seconds=2.0, log_tail="", host_oom_killed=True
    )
    assert killed.outcome is Outcome.OOM and killed.error == HOST_OOM
    plain = collect(tmp_path, returncode=-9, timed_out=None, wall_seconds=2.0, log_tail="")
    assert plain.outcome is Outcome.FAILED and "killed by signal 9" in (plain.error or "")
    (tmp_path / "result.json").write_text(Measurement(outcome=Outcome.OK).to_json())
    finished = collect(
        tmp_path, returncode=0, timed_out=None, wall_seconds=2.0, log_tail="", host_oom_killed=True
    )
    assert finished.outcome is Outcome.OK, finished.error
