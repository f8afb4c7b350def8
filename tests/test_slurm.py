"""launchers/slurm/explorer.sbatch on a real one-node Slurm that the test starts (slow, root only).

The fixture writes a slurm.conf and a MUNGE key into a temporary folder and starts ``munged``,
``slurmctld`` and ``slurmd`` in the foreground on 127.0.0.1 (free ports, ``proctrack/linuxproc``,
``task/none``), and stops each by its process id at the end. Each test submits the template with
the quickstart study (a CPU node: the template declares 2 logical GPUs, ``EXPLORER_GPUS_PER_NODE``),
waits for the job, and checks the study with ``explorer audit`` and that no process of the job is
left (none whose environment names this Slurm's slurm.conf, Ray's and the trials' included).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SBATCH = REPO / "launchers" / "slurm" / "explorer.sbatch"
BIN = Path(sys.executable).parent
DAEMONS = ("munged", "slurmctld", "slurmscriptd", "slurmd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(root: Path, host: str) -> str:
    return f"""\
ClusterName=explorertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Slurm:
    root: Path
    env: dict[str, str]
    """The environment of every Slurm command and job: this Slurm's slurm.conf, explorer's venv
    first on PATH, 2 logical GPUs a node, Ray bound to 127.0.0.1."""

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120)
        assert not check or done.returncode == 0, f"{' '.join(cmd)}: {done.stdout}{done.stderr}"
        return done

    def submit(self, folder: Path, *args: str) -> str:
        out = self.run("sbatch", "--parsable", "--chdir", str(folder), *args).stdout.strip()
        return out.split(";")[0]

    def job(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields (``{}`` once the job is gone)."""
        done = self.run("scontrol", "show", "job", "-o", job, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout)) if done.returncode == 0 else {}

    def wait_for_end(self, job: str, timeout_s: float = 900) -> dict[str, str]:
        """The job's fields once it ended (and every process of it is gone)."""
        deadline = time.monotonic() + timeout_s
        while (state := self.job(job).get("JobState")) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            assert time.monotonic() < deadline, f"job {job} still {state} after {timeout_s} s"
            time.sleep(2)
        deadline = time.monotonic() + 60  # the state is set before slurmstepd has reaped all
        while left := self.job_processes():
            assert time.monotonic() < deadline, f"job {job} ended, its processes did not: {left}"
            time.sleep(1)
        return self.job(job)

    def logs(self, chars: int = 4000) -> str:
        """The ends of slurmctld's and slurmd's logs, for a failure message."""
        tails = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / name
            tails.append(
                f"\n--- {name} ---\n" + (path.read_text(errors="replace")[-chars:] if path.exists() else "")
            )
        return "".join(tails)

    def job_processes(self) -> list[str]:
        """Every process whose environment names this Slurm's slurm.conf but the daemons: the
        jobs' (the batch script, srun, Ray's, the driver, the trials')."""
        import psutil

        mark = f"SLURM_CONF={self.env['SLURM_CONF']}"
        found = []
        for p in psutil.process_iter(["pid", "name", "cmdline"]):
            with contextlib.suppress(psutil.Error, OSError):  # OSError: a process of another namespace
                if p.info["name"] in DAEMONS or p.pid == os.getpid():
                    continue
                environ = Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0")
                if mark.encode() in environ and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:160]}")
        return found


def _start_slurm(root: Path) -> tuple[Slurm, list[subprocess.Popen[bytes]]]:
    host = socket.gethostname().split(".")[0]
    for sub in ("munge", "state", "spool"):
        (root / sub).mkdir(mode=0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, host))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "RAY_"))}
    env.update(
        SLURM_CONF=str(conf),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        EXPLORER_GPUS_PER_NODE="2",
        EXPLORER_NODE_IP="127.0.0.1",
    )
    munge = [f"--socket={root}/munge/socket", f"--key-file={key}", f"--pid-file={root}/munge/munged.pid"]
    munge += [f"--log-file={root}/munge/munged.log", f"--seed-file={root}/munge/seed"]
    logs = (root / "daemons.log").open("ab")
    procs = [subprocess.Popen(["munged", "--foreground", "--force", *munge], stdout=logs, stderr=logs)]
    time.sleep(0.5)  # the socket, before slurmctld asks it for a credential
    procs.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=env, stdout=logs, stderr=logs))
    procs.append(subprocess.Popen(["slurmd", "-D", "-N", host], env=env, stdout=logs, stderr=logs))
    slurm = Slurm(root=root, env=env)
    deadline = time.monotonic() + 60
    while slurm.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip() != "idle":
        dead = [p.args[0] for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            _stop(procs)
            raise AssertionError(
                f"Slurm did not start ({dead} exited): {(root / 'daemons.log').read_text()[-3000:]}"
            )
        time.sleep(0.5)
    return slurm, procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """TERM each daemon by its process id (slurmd first), KILL what is left after 15 s."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=15)


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    if os.geteuid() != 0:
        pytest.skip("needs root: slurmd starts each job as its user, and the test runs the daemons as root")
    if not all(shutil.which(d) for d in ("munged", "slurmctld", "slurmd", "sbatch")):
        subprocess.run(["bash", str(REPO / "scripts" / "slurm.sh"), "install"], check=True, timeout=900)
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    root.chmod(0o755)
    slurm, procs = _start_slurm(root)
    try:
        yield slurm
    finally:
        with contextlib.suppress(Exception):  # a test that failed mid-job: its job goes first
            slurm.run("scancel", "--user", "root", check=False)
            deadline = time.monotonic() + 60
            while slurm.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(1)
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)


def _study(folder: Path) -> Path:
    """The quickstart study, its storage and run folder in ``folder`` (the "shared filesystem")."""
    data = yaml.safe_load((REPO / "studies" / "quickstart.yaml").read_text())
    data["search_space"] = str(REPO / "search_spaces" / "quickstart.yaml")
    data["storage"] = f"sqlite:///{folder}/quickstart.db"
    path = folder / "quickstart.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _set_n_trials(study: Path, n: int) -> None:
    data = yaml.safe_load(study.read_text())
    data["n_trials"] = n
    study.write_text(yaml.safe_dump(data, sort_keys=False))


def _output(folder: Path, job: str) -> str:
    path = folder / f"explorer-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _wait_for_trials(slurm: Slurm, folder: Path, job: str, n: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while len(re.findall(r"^\[\s*\d+/\d+\] trial", _output(folder, job), re.M)) < n:
        state = slurm.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING"), f"job {job} {state}:\n{_output(folder, job)[-3000:]}"
        assert time.monotonic() < deadline, f"job {job}: {n} trial(s) not done in time"
        time.sleep(1)


def _audit(slurm: Slurm, study: Path) -> dict:
    done = slurm.run(str(BIN / "explorer"), "audit", "--json", str(study), check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


def _trials(study: Path) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = yaml.safe_load(study.read_text())["storage"]
    return optuna.load_study(study_name="quickstart", storage=storage).get_trials(deepcopy=False)


def _measured_keys(study: Path) -> list[str]:
    """The configuration of every trial that ran to a measurement (ok or oom), once per run."""
    return [
        json.dumps(t.params, sort_keys=True)
        for t in _trials(study)
        if t.user_attrs.get("status") in ("ok", "oom") and "reused_from" not in t.user_attrs
    ]


def _ended_clean(slurm: Slurm, info: dict[str, str], out: str) -> None:
    assert "explorer.sbatch: Ray stopped" in out, out[-3000:]
    assert not slurm.job_processes(), slurm.job_processes()
    assert not list(Path("/tmp").glob(f"ray-{info['JobId']}")), "Ray's temp folder is left"


@pytest.mark.slow  # a real study in a real Slurm job: in `make test-slow` (CI runs it after `make test`)
@pytest.mark.timeout(1200)
def test_a_study_runs_to_its_end_in_a_slurm_job(slurm, tmp_path):
    study = _study(tmp_path)
    job = slurm.submit(tmp_path, str(SBATCH), str(study))
    info = slurm.wait_for_end(job)
    out = _output(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out[-3000:]
    assert "explorer.sbatch: 1 Ray node(s) up, 2 GPUs" in out
    assert "explorer optimize exited with status 0" in out
    audit = _audit(slurm, study)
    assert audit["ok"], audit
    assert (audit["counted"], audit["n_trials"]) == (14, 14)
    _ended_clean(slurm, info, out)

    # explorer plan's sbatch line for the chosen run, submitted as printed: its check run trains
    plan = slurm.run(
        str(BIN / "explorer"),
        "plan",
        str(study),
        "--tokens",
        "1e6",
        "--steps",
        "2",
        "--out",
        str(tmp_path / "plan"),
    )
    line = next(s.strip() for s in plan.stdout.splitlines() if s.strip().startswith("sbatch "))
    words = shlex.split(line)
    assert words[1:3] == ["--nodes=1", "--ntasks-per-node=1"] and words[3].startswith("--time=0-00:"), line
    checked = slurm.submit(tmp_path, "--output", str(tmp_path / "plan-%j.out"), *words[1:])
    info = slurm.wait_for_end(checked)
    said = (tmp_path / f"plan-{checked}.out").read_text(errors="replace")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), said[-3000:]
    assert re.search(r"^trained \d+ steps .* dataset tok/s/gpu", said, re.M), said[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_scancel_term_stops_the_study_and_a_resubmitted_job_resumes_it(slurm, tmp_path):
    study = _study(tmp_path)
    job = slurm.submit(tmp_path, str(SBATCH), str(study), "--n-trials", "4")
    _wait_for_trials(slurm, tmp_path, job, 1)
    slurm.run("scancel", "--signal=TERM", job)
    info = slurm.wait_for_end(job)
    out = _output(tmp_path, job)
    assert "interrupted: in-flight trials are marked interrupted" in out, out[-3000:]
    assert "explorer optimize exited with status 143" in out
    assert info["ExitCode"] == "143:0", info
    _ended_clean(slurm, info, out)
    before = _measured_keys(study)
    assert 1 <= len(before) < 4
    assert not [t.number for t in _trials(study) if t.state.name == "RUNNING"]

    again = slurm.submit(tmp_path, str(SBATCH), str(study), "--n-trials", "4")
    info = slurm.wait_for_end(again)
    out = _output(tmp_path, again)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out[-3000:]
    assert re.search(r"quickstart.*: [1-3]/4 trials done", out), out[-3000:]  # it resumed
    audit = _audit(slurm, study)
    assert audit["ok"], audit
    after = _measured_keys(study)
    assert len(after) == len(set(after)) and set(before) <= set(after)  # nothing measured twice
    _ended_clean(slurm, info, out)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_time_limit_warning_stops_the_study_and_a_requeued_job_resumes_it(slurm, tmp_path):
    study = _study(tmp_path)
    # The first run has 30 trials to do, so it still runs when the warning comes (the quickstart's
    # 14 can all end first); the study file then asks for a few more than are done, so the requeued
    # run re-runs the interrupted trials and ends soon (the file is read anew by each run).
    _set_n_trials(study, 30)
    job = slurm.submit(tmp_path, "--requeue", "--time=30", str(SBATCH), str(study))
    _wait_for_trials(slurm, tmp_path, job, 1)
    # the time limit moves to under 10 minutes ahead: the template's --signal=B:USR1@600 is due,
    # and slurmctld sends it at its next check (every 30 s)
    minutes = int(slurm.job(job)["RunTime"].split(":")[-2]) + 5
    slurm.run("scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}")
    deadline = time.monotonic() + 180
    while "the time limit is near" not in _output(tmp_path, job):
        assert time.monotonic() < deadline, _output(tmp_path, job)[-3000:]
        time.sleep(1)
    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=30")  # for its next run
    finished = len(re.findall(r"^\[\s*\d+/\d+\] trial", _output(tmp_path, job), re.M))
    _set_n_trials(study, finished + 3)  # at most two trials were in flight: one at least is left
    deadline = time.monotonic() + 900
    ended_at = None  # when the job was first seen ended badly
    seen: list[str] = []  # the states it went through, for the message
    while slurm.job(job).get("Restarts") != "1" or slurm.job(job).get("JobState") != "COMPLETED":
        fields = slurm.job(job)
        state = fields.get("JobState")
        if not seen or seen[-1] != f"{state}/{fields.get('Restarts')}":
            seen.append(f"{state}/{fields.get('Restarts')}")
        # a requeued job waits 2 min (Slurm's guard against the first run's late messages): it
        # starts now only once every process of that run is gone, slurmstepd included, which
        # reports the batch script's exit before it exits (a run started sooner was seen FAILED:
        # the first run's exit status, 143, taken as the second's)
        if state == "PENDING" and fields.get("Reason") == "BeginTime" and not slurm.job_processes():
            slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
        # the script exits 143 just after requeueing its job: slurmctld may show the run's end
        # (FAILED) before the requeue turns it PENDING (seen once under load); only a state that
        # stays is the job's
        if state in ("FAILED", "CANCELLED", "TIMEOUT"):  # either run's end, if it stays
            ended_at = ended_at or time.monotonic()
            assert time.monotonic() - ended_at < 60, (
                f"job {job} went {seen}: " + _output(tmp_path, job)[-3000:] + slurm.logs()
            )
        else:
            ended_at = None
        assert time.monotonic() < deadline, f"job {job} went {seen}: " + slurm.logs()
        time.sleep(2)
    info = slurm.wait_for_end(job)
    out = _output(tmp_path, job)  # --open-mode=append: both runs
    assert info["ExitCode"] == "0:0", out[-3000:]
    assert "interrupted: in-flight trials are marked interrupted" in out
    assert "requeued: the study resumes in the job's next run" in out
    assert "(restart 1)" in out, out[-3000:]
    resumed = re.search(r"quickstart.*: (\d+)/(\d+) trials done", out.split("(restart 1)")[-1])
    assert resumed and 0 < int(resumed[1]) < int(resumed[2]) == finished + 3, out[-3000:]
    audit = _audit(slurm, study)
    assert audit["ok"], audit
    after = _measured_keys(study)
    assert len(after) == len(set(after))
    _ended_clean(slurm, info, out)


# -- explorer plan's sbatch line (no Slurm needed) -------------------------------------------------


def _row(gpus: int, nodes: int, per_gpu: float, **band: float):
    from explorer.plan import PlanRow
    from explorer.trial_config import TrialConfig

    config = TrialConfig(
        batch_size=8,
        number_gpus=gpus,
        number_nodes=nodes,
        distributed_backend="DDP",
        gradient_checkpointing=False,
        model_max_length=64,
    )
    trial = None if band else 3
    return PlanRow(
        study="s", gpu_model="NVIDIA-H100-80GB-HBM3", config=config, per_gpu=per_gpu, trial=trial, **band
    )


def test_the_time_limit_is_the_predicted_hours_with_the_margin_rounded_up_to_the_minute():
    from explorer.plan import PlanJob, time_limit, time_limit_hours

    job = PlanJob(tokens=3.6e9)  # 1e6 tok/s in all: 1 hour
    row = _row(8, 1, per_gpu=1e6 / 8)
    assert row.hours(job) == pytest.approx(1.0)
    assert time_limit_hours(row, job) == pytest.approx(1.0 * 1.2 + 15 / 60)
    assert time_limit(1.45) == "0-01:27:00"
    assert time_limit(1.4501) == "0-01:28:00"  # up, never down
    assert time_limit(50.0) == "2-02:00:00"
    # an extrapolated row asks for its band's slow end (the low throughput)
    slow = _row(16, 2, per_gpu=1e6 / 16, low=0.5e6 / 16, high=1.2e6 / 16)
    assert time_limit_hours(slow, job) == pytest.approx(2.0 * 1.2 + 0.25)


def test_the_sbatch_line_asks_for_the_nodes_and_gpus_and_starts_torchrun_on_each_node(tmp_path):
    from explorer.best import torchrun_command
    from explorer.plan import PlanJob, sbatch_command

    job = PlanJob(tokens=3.6e9)
    row = _row(16, 2, per_gpu=1e6 / 16)
    torchrun = torchrun_command(row.config, job_file=tmp_path / "job.json", steps=20)
    words = shlex.split(sbatch_command(row, job, torchrun=torchrun))
    assert words[:5] == [
        "sbatch",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--time=0-01:27:00",
    ]
    wrap = words[5].removeprefix("--wrap=")
    assert len(words) == 6 and wrap != words[5]
    # what each node's task runs, with the variables Slurm sets there: the torchrun of node 1
    inner = shlex.split(wrap.split("srun bash -c ", 1)[1])[0]
    shown = subprocess.run(
        ["bash", "-c", inner.replace("exec ", "printf '%s\\n' ", 1)],
        env={"SLURM_NODEID": "1", "MASTER_ADDR": "node-a", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown[:5] == ["torchrun", "--nnodes", "2", "--nproc_per_node", "8"]
    assert (
        shown[shown.index("--node_rank") + 1] == "1" and shown[shown.index("--master_addr") + 1] == "node-a"
    )
    assert "scontrol show hostnames" in wrap.split("srun", 1)[0]  # MASTER_ADDR: the first node
    one = shlex.split(sbatch_command(_row(4, 1, per_gpu=1e6 / 4), job, torchrun="torchrun x", gpus=False))
    assert one == [
        "sbatch",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--time=0-01:27:00",
        "--wrap=srun torchrun x",
    ]
