"""Multi-node trials on a real 2-node Ray cluster on this machine (real ``ray start``, torchrun, gloo).

The fixture starts a head and a second node with ``ray start``, each with 2 logical GPUs and a
temp dir of its own, and tears both down by process id at the end (``ray stop`` would stop every
Ray of this user on the machine, other sessions' included). The cluster uses token authentication
with a token of its own, passed in the environment of every process that talks to it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from explorer.launch._command import free_port
from explorer.launch._placement import LOST, Share, combine_nodes, fits_on_nodes
from explorer.measurement import Measurement, Outcome

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


# -- the accounting and the outcome rules, without Ray -------------------------------------------


def test_fits_on_nodes_needs_n_nodes_with_g_free_each():
    capacity = {"a": 2, "b": 2}
    assert fits_on_nodes(capacity, [], number_gpus=4, number_nodes=2)
    assert not fits_on_nodes(capacity, [], number_gpus=4, number_nodes=1)  # no node has 4
    one_on_a = [Share("a", 1)]
    assert fits_on_nodes(capacity, one_on_a, number_gpus=2, number_nodes=2)  # 1 free on a, 2 on b
    assert not fits_on_nodes(capacity, one_on_a, number_gpus=4, number_nodes=2)
    assert fits_on_nodes(capacity, [Share("a", 2)], number_gpus=2, number_nodes=1)  # on b
    assert not fits_on_nodes(capacity, [Share("a", 2)], number_gpus=2, number_nodes=2)
    # a share not placed yet may be on either node: it is taken from both
    assert not fits_on_nodes(capacity, [Share(None, 1)], number_gpus=4, number_nodes=2)
    assert fits_on_nodes(capacity, [Share(None, 1)], number_gpus=2, number_nodes=2)
    assert not fits_on_nodes({"a": 8}, [], number_gpus=2, number_nodes=2)  # one node only


def _part(outcome: Outcome, error: str | None = None, rank: int = 0) -> Measurement:
    return Measurement(
        outcome=outcome,
        error=error,
        wall_seconds=1.0 + rank,
        extra={"ranks": [{"rank": rank, "ray_node": f"n{rank}"}], "ray_node": f"n{rank}"},
    )


def test_combine_nodes_follows_the_one_node_rules():
    args = dict(number_nodes=2, missing_error="killed")
    crash, oom = (
        _part(Outcome.FAILED, "rank 1: gloo: connection closed", 1),
        _part(Outcome.OOM, "rank 0: oom"),
    )
    m = combine_nodes({1: crash, 0: oom}, arrival=[1, 0], **args)
    assert m.outcome is Outcome.OOM and m.error == "node 0: rank 0: oom"  # an OOM anywhere wins
    assert [r["rank"] for r in m.extra["ranks"]] == [0, 1] and m.extra["rank_nodes"] == "0@n0 1@n1"
    first = _part(Outcome.FAILED, "rank 0: first", 0)
    m = combine_nodes({0: first, 1: crash}, arrival=[1, 0], **args)
    assert m.outcome is Outcome.FAILED and m.error == "node 1: rank 1: gloo: connection closed"
    # a node whose actor died is the cause, even when its peer's error came back first
    lost = Measurement(outcome=Outcome.FAILED, error="Ray: The actor died unexpectedly", extra={LOST: True})
    m = combine_nodes({0: first, 1: lost}, arrival=[0, 1], **args)
    assert m.outcome is Outcome.FAILED and m.error == "node 1: Ray: The actor died unexpectedly"
    m = combine_nodes({0: _part(Outcome.OK)}, arrival=[0], **args)  # node 1 never answered
    assert m.outcome is Outcome.FAILED and m.error == "node 1: killed"
    m = combine_nodes({0: _part(Outcome.OK), 1: _part(Outcome.OK, rank=1)}, arrival=[1, 0], **args)
    assert m.outcome is Outcome.FAILED and "no measurement" in (m.error or "")  # node 0 had no result
    assert m.wall_seconds == 2.0


# -- the real cluster ------------------------------------------------------------------------------


@dataclass
class Cluster:
    address: str
    env: dict[str, str]
    """What a process needs to talk to the cluster (its token) and import this checkout."""
    temp_dirs: list[Path]

    def raylet_pids(self) -> set[int]:
        import psutil

        pids = set()
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "raylet/raylet" in cmd and any(str(d) in cmd for d in self.temp_dirs):
                pids.add(p.pid)
        return pids


def _ports() -> list[str]:
    """Every port a node opens, chosen free (the defaults would collide with other Rays here)."""
    flags = ["--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port"]
    flags += ["--metrics-export-port"]
    return [x for flag in flags for x in (flag, str(free_port()))]


def _stop(temp_dirs: list[Path]) -> None:
    """SIGKILL every process of this cluster: those naming its temp dirs, and their descendants."""
    import psutil

    victims: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.pid != os.getpid() and any(str(d) in cmd for d in temp_dirs):
            victims[p.pid] = p
            with contextlib.suppress(psutil.NoSuchProcess):
                victims.update({c.pid: c for c in p.children(recursive=True)})
    for p in victims.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(list(victims.values()), timeout=15)


@pytest.fixture
def two_node_cluster() -> Iterator[Cluster]:
    """A head and one more node, 2 logical GPUs (and 2 ``CPU-logical``) each, on 127.0.0.1."""
    temp_dirs = [Path(tempfile.mkdtemp(prefix="rmn-", dir="/tmp")) for _ in range(2)]  # short: sockets
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    common = ["--num-cpus", "2", "--num-gpus", "2", "--resources", '{"CPU-logical": 2}']
    common += ["--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    head = [RAY, "start", "--head", "--port", str(port), *common, "--temp-dir", str(temp_dirs[0])]
    head += ["--include-dashboard=false", "--dashboard-port", str(free_port())]
    head += ["--ray-client-server-port", str(free_port()), *_ports()]
    worker = [RAY, "start", "--address", f"127.0.0.1:{port}", *common, "--temp-dir", str(temp_dirs[1])]
    worker += _ports()
    try:
        for cmd in (head, worker):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        yield Cluster(address=f"127.0.0.1:{port}", env=env, temp_dirs=temp_dirs)
    finally:
        _stop(temp_dirs)
        for d in temp_dirs:
            shutil.rmtree(d, ignore_errors=True)


def _cluster_state(cluster: Cluster) -> dict:
    """The cluster's alive GPU nodes and its placement groups' states, from a separate driver."""
    code = (
        "import json, ray\n"
        f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
        "nodes = [n['NodeID'] for n in ray.nodes() if n['Alive'] and n['Resources'].get('GPU')]\n"
        "pgs = [pg['state'] for pg in ray.util.placement_group_table().values()]\n"
        "print(json.dumps({'nodes': nodes, 'placement_groups': pgs}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=cluster.env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _worker_processes() -> list[str]:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess):
            cmd = " ".join(p.info["cmdline"] or [])
            if "-m explorer.worker" in cmd and str(REPO) not in cmd and "zygote" not in cmd:
                found.append(f"{p.pid} {cmd[:200]}")
    return found


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_a_two_node_trial_runs_across_both_ray_nodes(two_node_cluster, write_study, tmp_path):
    cluster = two_node_cluster
    state = _cluster_state(cluster)
    assert len(state["nodes"]) == 2
    path = write_study(
        {
            "storage": f"sqlite:///{tmp_path}/s.db",
            "output_dir": str(tmp_path / "runs"),
            "n_trials": 4,
            "sampler": {"kind": "grid"},
            # both "nodes" share this machine's cores: one thread per process, as on one node
            "resources": {"gpus_per_node": 2, "nodes": 2, "cpus_per_trial_process": 1},
            "launcher": {"address": cluster.address, "warm_start": False},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4, 512]},  # 512: OOM under the 0.5 GiB cap
                    "number_gpus": {"values": [2]},
                    "number_nodes": {"values": [1, 2]},
                    "distributed_backend": {"choices": ["DDP"]},
                    "gradient_checkpointing": {"choices": [False]},
                }
            },
        }
    )
    before = set(_worker_processes())
    started = time.monotonic()
    cli = [sys.executable, "-m", "explorer"]
    run = subprocess.run(
        [*cli, "optimize", str(path)], env=cluster.env, capture_output=True, text=True, timeout=600
    )
    wall = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    print(run.stdout)
    print(f"explorer optimize: {wall:.1f} s")

    import optuna

    study = optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path}/s.db")
    trials = {(t.user_attrs["batch_size"], t.user_attrs["number_nodes"]): t for t in study.get_trials()}
    assert set(trials) == {(4, 1), (4, 2), (512, 1), (512, 2)}
    for nodes in (1, 2):
        t = trials[4, nodes]
        assert t.user_attrs["status"] == "ok", t.user_attrs.get("error")
        assert t.user_attrs["dataset_tokens_per_second"] > 0
        assert t.user_attrs["wrapper"] == "DistributedDataParallel"
        oom = trials[512, nodes]
        assert oom.user_attrs["status"] == "oom", oom.user_attrs.get("error")
        assert "can't allocate memory" in oom.user_attrs["error"]
    # an OOM across nodes: named by its node, and every node's actor answered or was killed
    assert trials[512, 2].user_attrs["error"].startswith("node ")
    assert len({r["ray_node"] for r in trials[512, 2].user_attrs["ranks"]}) == 2

    two, one = trials[4, 2], trials[4, 1]
    ranks = two.user_attrs["ranks"]  # written by the ranks themselves, from torchrun's environment
    assert [(r["rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    rank_nodes = [r["ray_node"] for r in ranks]
    assert len(set(rank_nodes)) == 2 and set(rank_nodes) == set(state["nodes"])
    # each rank is a descendant of a different one of the cluster's two raylets
    assert {int(r["raylet_pid"]) for r in ranks} == cluster.raylet_pids()
    assert [n["node_rank"] for n in two.user_attrs["nodes"]] == [0, 1]
    assert [n["ray_node"] for n in two.user_attrs["nodes"]] == rank_nodes
    assert two.user_attrs["rank_nodes"] == f"0@{rank_nodes[0]} 1@{rank_nodes[1]}"
    # the one-node trial: both ranks on one Ray node
    assert [r["rank"] for r in one.user_attrs["ranks"]] == [0, 1]
    assert len({r["ray_node"] for r in one.user_attrs["ranks"]}) == 1

    # nothing left: every placement group removed, no training process running
    after = _cluster_state(cluster)
    assert after["placement_groups"] and set(after["placement_groups"]) == {"REMOVED"}
    assert set(_worker_processes()) - before == set()

    status = subprocess.run(
        [*cli, "status", str(path)], env=cluster.env, capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0, status.stderr
    print(status.stdout)
    placed = [line for line in status.stdout.splitlines() if line.startswith(f"trial {two.number} ranks:")]
    assert len(placed) == 1 and all(n[:12] in placed[0] for n in rank_nodes)

    out = tmp_path / "export.csv"
    exported = subprocess.run(
        [*cli, "export", str(path), "--csv", str(out)], env=cluster.env, capture_output=True, text=True
    )
    assert exported.returncode == 0, exported.stderr
    rows = {(int(r["batch_size"]), int(r["number_nodes"])): r for r in csv.DictReader(out.open())}
    assert rows[4, 2]["rank_nodes"] == two.user_attrs["rank_nodes"]


def _descendants_running(root_pids: set[int], needle: str) -> list[int]:
    """Processes under ``root_pids`` whose command line holds ``needle``."""
    import psutil

    found = []
    for pid in root_pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if needle in " ".join(child.cmdline()):
                        found.append(child.pid)
    return found


@pytest.mark.slow  # a real node loss on the 2-node cluster: in `make test-slow`, about 80 s here
def test_a_lost_node_fails_its_trial_in_one_line_without_rays_node_logs(
    two_node_cluster, write_study, tmp_path
):
    """The second node's raylet is SIGKILLed while a two-node trial trains on it. Ray's agents on
    that node then publish the raylet's last log lines to every driver (43 lines in all), which
    Ray's driver printed as ``(raylet)`` lines: they go to ``ray-messages.log`` in the run folder,
    the driver prints one line about them, the trial fails in its own line, and the study audits."""
    cluster = two_node_cluster
    runs = tmp_path / "runs"
    path = write_study(
        {
            "storage": f"sqlite:///{tmp_path}/s.db",
            "output_dir": str(runs),
            "n_trials": 2,
            "sampler": {"kind": "grid"},
            "resources": {"gpus_per_node": 2, "nodes": 2, "cpus_per_trial_process": 1},
            "launcher": {"address": cluster.address, "warm_start": False, "max_retries": 0},
            # the node dies mid-training (3 s into its 10, after its ranks' start and warmup); a
            # retry would wait for the dead node's placement (minutes)
            "measurement": {"stop": "seconds", "stop_after_seconds": 10, "trial_timeout_s": 240},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4]},
                    "number_gpus": {"values": [2]},
                    "number_nodes": {"values": [1, 2]},  # the grid runs the one-node trial first
                    "distributed_backend": {"choices": ["DDP"]},
                    "gradient_checkpointing": {"choices": [False]},
                }
            },
        }
    )
    second = {pid for pid in cluster.raylet_pids() if str(cluster.temp_dirs[1]) in _cmdline(pid)}
    assert len(second) == 1
    before = set(_worker_processes())
    cli = [sys.executable, "-m", "explorer"]
    out_path, err_path = tmp_path / "driver.out", tmp_path / "driver.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        driver = subprocess.Popen([*cli, "optimize", str(path)], env=cluster.env, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 150
        # the first trial done, then the second one's ranks on node 2
        while time.monotonic() < deadline and not (
            "[  1/2]" in out_path.read_text() and _descendants_running(second, "explorer.worker")
        ):
            assert driver.poll() is None, out_path.read_text() + err_path.read_text()
            time.sleep(0.5)
        assert _descendants_running(second, "explorer.worker"), out_path.read_text() + err_path.read_text()
        time.sleep(3)  # training
        os.kill(next(iter(second)), 9)
        driver.wait(timeout=150)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out, err = out_path.read_text(), err_path.read_text()
    print(out + err)
    assert driver.returncode == 0, out + err
    # Ray's messages reached this driver (else the test proves nothing) and went to the file
    kept = (runs / "ray-messages.log").read_text()
    assert "Raylet is terminated" in kept and "Last 20 lines of the Raylet logs" in kept
    assert "(raylet)" not in out + err and "Raylet" not in out + err
    said = [line for line in (out + err).splitlines() if line.startswith("ray: ")]
    assert len(said) == 1 and "raylet died" in said[0] and str(runs / "ray-messages.log") in said[0]
    assert err.strip() == said[0]  # nothing else on stderr

    import optuna

    study = optuna.load_study(study_name="test", storage=f"sqlite:///{tmp_path}/s.db")
    trials = {t.user_attrs["number_nodes"]: t for t in study.get_trials()}
    assert set(trials) == {1, 2}
    assert trials[1].user_attrs["status"] == "ok", trials[1].user_attrs.get("error")
    lost = trials[2]
    assert lost.user_attrs["status"] == "failed" and lost.user_attrs["error"].startswith("node ")
    assert not [t for t in study.get_trials() if t.state is optuna.trial.TrialState.RUNNING]
    (failed_line,) = [
        line for line in out.splitlines() if f"trial {lost.number} " in line and "failed" in line
    ]
    assert "Ray:" in failed_line
    audited = subprocess.run([*cli, "audit", str(path)], env=cluster.env, capture_output=True, text=True)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert set(_worker_processes()) - before == set()


def _cmdline(pid: int) -> str:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        return " ".join(psutil.Process(pid).cmdline())
    return ""
