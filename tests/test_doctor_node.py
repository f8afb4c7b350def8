"""``explorer doctor``'s node measurement: a real fp32 matmul and real gloo all-reduce and all-gather
between two CPU processes, the figures' arithmetic (nccl-tests' bus bandwidth), the table and JSON,
the study's record, and ``explorer estimate`` pricing a CPU study with the recorded figures.

No assertion depends on how fast this machine is: figures are checked for structure, sign and
consistency with each other, and the estimate against the physics given the same figures."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import psutil
import pytest
import yaml

from explorer.doctor import (
    CPU_PROCESSES,
    FAILED,
    ONE_NODE,
    DoctorReport,
    Node,
    Row,
    allgather_busbw,
    allreduce_busbw,
    measure_between_nodes,
    measure_here,
    measure_node,
    record_findings,
    render_table,
    summarize_ranks,
)
from explorer.doctor._node import REPEATS, SIZES
from explorer.gpus import DECLARED, MEASURED, gpu_figures, lookup

ROOT = Path(__file__).resolve().parents[1]
KEYS = {
    "device",
    "processes",
    "backend",
    "threads_per_process",
    "matmul_dtype",
    "matmul_size",
    "matmul_tflops",
    "memory_bandwidth_tbs",
    "allocatable_gib",
    "allocation_probe_gib",
    "memory_limits_gib",
    "collective_bytes",
    "repeats",
    "allreduce_algbw_gbs",
    "allreduce_busbw_gbs",
    "allgather_algbw_gbs",
    "allgather_busbw_gbs",
    "inter_node",
    "inter_node_why",
    "seconds",
}


def _env() -> dict[str, str]:
    from explorer.launch import zygote_environment

    return zygote_environment(cpu_count=os.cpu_count() or 1)


@pytest.fixture(scope="module")
def cpu_node() -> dict:
    """One real measurement of this node: two CPU processes, gloo."""
    return measure_node("cpu", CPU_PROCESSES, env=_env())


def test_two_cpu_processes_measure_matmul_memory_and_gloo_collectives(cpu_node):
    m = cpu_node
    assert set(m) == KEYS
    assert (m["device"], m["backend"], m["processes"]) == ("cpu", "gloo", 2)
    assert m["matmul_dtype"] == "float32" and m["matmul_size"] == SIZES["cpu"]["matmul"]
    assert m["threads_per_process"] == max(1, (os.cpu_count() or 1) // 2)
    for key in ("matmul_tflops", "memory_bandwidth_tbs", "allocatable_gib", "seconds"):
        assert math.isfinite(m[key]) and m[key] > 0, key
    for name in ("allreduce", "allgather"):
        assert math.isfinite(m[f"{name}_algbw_gbs"]) and m[f"{name}_algbw_gbs"] > 0
    # nccl-tests' convention, recomputed from the recorded algbw and n
    assert m["allreduce_busbw_gbs"] == pytest.approx(m["allreduce_algbw_gbs"] * 2 * (2 - 1) / 2, rel=1e-12)
    assert m["allgather_busbw_gbs"] == pytest.approx(m["allgather_algbw_gbs"] * (2 - 1) / 2, rel=1e-12)
    # memory: what the kernel says is available (no cgroup or RLIMIT_AS tighter here is allowed
    # for), never more than the machine has, and a bounded real allocation checked it
    assert m["allocatable_gib"] <= psutil.virtual_memory().total / 2**30
    assert m["allocatable_gib"] == pytest.approx(min(m["memory_limits_gib"].values()), abs=1e-3)
    assert 0 < m["allocation_probe_gib"] <= 0.25
    assert m["collective_bytes"] == SIZES["cpu"]["collective"] and m["repeats"] == REPEATS
    assert m["inter_node"] is None and m["inter_node_why"] == "not measured: one node"
    json.dumps(m)  # recordable as it is


def test_the_figures_are_the_slowest_rank_and_the_median_repeat():
    """:func:`summarize_ranks`' arithmetic on given rank measurements: each collective's time is
    the slowest rank's in each repeat, the median of those; the slowest device's matmul."""
    size = 8 * 2**20
    a = {"rank": 0, "threads": 1, "matmul_tflops": [1.0, 3.0, 2.0, 2.0, 2.0], "copy_tbs": [0.1] * 5}
    b = {"rank": 1, "threads": 1, "matmul_tflops": [1.5] * 5, "copy_tbs": [0.2] * 5}
    a |= {"allreduce": [0.010, 0.030, 0.020, 0.050, 0.040], "allgather": [0.01] * 5}
    b |= {"allreduce": [0.020, 0.010, 0.060, 0.010, 0.010], "allgather": [0.02] * 5}
    a["memory"] = {"allocatable": 6 * 2**30, "probe": 2**28, "limits_gib": {"available": 6.0}}
    m = summarize_ranks([a, b], device="cpu", size=size)
    slowest = [max(x, y) for x, y in zip(a["allreduce"], b["allreduce"], strict=True)]
    algbw = size / statistics.median(slowest) / 1e9
    assert m["allreduce_algbw_gbs"] == pytest.approx(algbw)
    assert m["allreduce_busbw_gbs"] == pytest.approx(allreduce_busbw(algbw, 2)) == pytest.approx(algbw)
    assert m["allgather_busbw_gbs"] == pytest.approx(allgather_busbw(size / 0.02 / 1e9, 2))
    assert m["matmul_tflops"] == 1.5 and m["memory_bandwidth_tbs"] == 0.1 and m["allocatable_gib"] == 6.0
    assert allreduce_busbw(10.0, 8) == pytest.approx(17.5) and allgather_busbw(10.0, 8) == pytest.approx(8.75)
    one = summarize_ranks([a], device="cpu", size=size)  # one process: no collective
    assert one["backend"] is None and one["allreduce_busbw_gbs"] is None and one["collective_bytes"] is None


def test_a_failed_rank_is_one_line_and_the_doctor_goes_on(tmp_path):
    """A rank that fails (here torch does not import in the ranks' environment: a
    ``sitecustomize`` blocks it) ends the measurement with its last line; the doctor records the
    failure and goes on."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ImportError('torch is blocked by the test')\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    with pytest.raises(RuntimeError, match=r"rank \d exited 1: ImportError: torch is blocked by the test$"):
        measure_node("cpu", 2, env=env)
    failed = measure_here(Node(device="cpu", gpus=2, model_type="llama"), env)
    assert set(failed) == {"error"} and "torch is blocked by the test" in failed["error"]
    assert "measured: failed: " in render_table(_report(failed))


def _report(measured: dict | None, gpu_model: str = "CPU-logical") -> DoctorReport:
    node = {"host": "h", "torch": "2.13", "packages": {}}
    return DoctorReport(study="quickstart", gpu_model=gpu_model, node=node, device="cpu", measured=measured)


def test_the_table_and_json_show_the_figures_and_the_study_records_them(cpu_node, tmp_path):
    from explorer.record import StudyRecord
    from explorer.study import load_readonly

    report = _report(cpu_node)
    data = json.loads(report.to_json())
    assert data["measured"] == json.loads(json.dumps(cpu_node))
    text = render_table(report)
    assert f"matmul {cpu_node['matmul_tflops']:.4g} TFLOP/s float32" in text
    assert f"all-reduce busbw {cpu_node['allreduce_busbw_gbs']:.4g} GB/s" in text
    assert f"all-gather busbw {cpu_node['allgather_busbw_gbs']:.4g} GB/s" in text
    assert "between nodes: not measured: one node" in text
    between = {"backend": "gloo", "allreduce_busbw_gbs": 1.25, "allgather_busbw_gbs": 0.5}
    two = render_table(
        _report({**cpu_node, "inter_node": between, "inter_node_why": "measured between a and b"})
    )
    assert (
        "between nodes (gloo): all-reduce busbw 1.25 GB/s, all-gather busbw 0.5 GB/s: measured between a and b"
        in two
    )
    loaded = _loaded(tmp_path)
    record_findings(loaded, report)
    stored = StudyRecord.of(load_readonly(loaded))
    assert stored.measured_node("CPU-logical") == data["measured"]
    assert stored.measured_node("NVIDIA-H100-80GB-HBM3") is None
    record_findings(loaded, _report({"error": "boom"}))  # a failed measurement records none
    assert StudyRecord.of(load_readonly(loaded)).measured_node("CPU-logical") is None


def _loaded(tmp_path: Path, **resources: object):
    """The quickstart study (a CPU study: 2 processes, gloo) with its storage in ``tmp_path``."""
    from explorer.study_file import load_study

    raw = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    raw["search_space"] = str(ROOT / "search_spaces" / "quickstart.yaml")
    raw["resources"].update(resources)
    raw.update(storage=f"sqlite:///{tmp_path}/study.db", output_dir=str(tmp_path / "runs"))
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_study(path, check_model=False, check_launcher=False, check_hub=False)


def _rates(loaded) -> dict[str, float]:
    from explorer.estimate import estimate_study

    return {e.key: e.dataset_tokens_per_second_per_gpu for e in estimate_study(loaded, sets={}, measured=[])}


def test_estimate_prices_a_cpu_study_with_the_recorded_figures(cpu_node, tmp_path):
    """Before the doctor records figures a CPU study is ranked at the physics' stand-in; after,
    each estimate is the physics' with the measured figures, and doubling the recorded matmul
    rate raises every estimate by what the physics says, and at most 2x."""
    from explorer.estimate import describe, estimate_study
    from explorer.gpus import study_figures
    from explorer.search._physics import JobPhysics

    loaded = _loaded(tmp_path, device_memory_gib=None)
    r = loaded.spec.resources
    before = estimate_study(loaded, sets={}, measured=[])
    assert all(e.fits is None for e in before)  # no memory limit known: not measured, no cap
    assert "ranked, not priced" in describe(loaded, before, top=1, measured=0)[0]

    record_findings(loaded, _report(cpu_node))
    figures = study_figures(r, cpu_node)
    assert figures is not None and figures.sources["bf16_tflops"] == MEASURED
    assert figures.peak_flops == pytest.approx(cpu_node["matmul_tflops"] * 1e12)
    assert figures.busbw_gbs == pytest.approx(cpu_node["allreduce_busbw_gbs"]) == figures.link_gbs
    physics = JobPhysics(workload=loaded.spec.workload, resources=r, figures=figures)
    assert physics.link == pytest.approx(cpu_node["allreduce_busbw_gbs"] * 1e9)
    # the node's memory is shared by the study's processes on it
    assert physics.limit_gib == pytest.approx(cpu_node["allocatable_gib"] / r.gpus_per_node)
    after = estimate_study(loaded, sets={}, measured=[])
    assert all(e.fits is not None for e in after)
    configs = {c.key(): c for c in loaded.space.enumerate()}
    for e in after:
        assert math.log(e.dataset_tokens_per_second_per_gpu) == pytest.approx(
            physics.log_throughput(configs[e.key]), rel=1e-6
        )
    header = describe(loaded, after, top=1, measured=0)[0]
    assert (
        f"{cpu_node['matmul_tflops']:.4g} TFLOP/s float32" in header
        and "measured by explorer doctor" in header
    )

    doubled = {**cpu_node, "matmul_tflops": 2 * cpu_node["matmul_tflops"]}
    record_findings(loaded, _report(doubled))
    faster = JobPhysics(workload=loaded.spec.workload, resources=r, figures=study_figures(r, doubled))
    was = {e.key: e.dataset_tokens_per_second_per_gpu for e in after}
    for key, rate in _rates(loaded).items():
        assert math.log(rate) == pytest.approx(faster.log_throughput(configs[key]), rel=1e-6)
        assert was[key] < rate <= 2 * was[key] * (1 + 1e-9)


def test_declared_figures_win_over_measured_ones_which_win_over_the_table():
    row = lookup("NVIDIA-H100-80GB-HBM3")
    assert row is not None
    node = {
        "device": "cuda",
        "backend": "nccl",
        "matmul_tflops": 700.0,
        "allocatable_gib": 78.5,
        "memory_bandwidth_tbs": 2.9,
        "allreduce_busbw_gbs": 360.0,
    }
    measured = gpu_figures(row.label, None, node)
    assert measured is not None
    assert (measured.bf16_tflops, measured.memory_gb, measured.cuda_gib) == (700.0, 78.5, 78.5)
    assert measured.bandwidth_tbs == 2.9 and measured.busbw_gbs == 360.0
    assert (measured.link, measured.link_gbs) == (row.link, row.link_gbs)  # NVIDIA's link figure stays
    assert (
        measured.sources["bf16_tflops"] == MEASURED
        and measured.sources["link_gbs"] == row.sources["link_gbs"]
    )
    both = gpu_figures(row.label, {"bf16_tflops": 600.0}, node)
    assert both is not None and both.bf16_tflops == 600.0 and both.sources["bf16_tflops"] == DECLARED
    assert both.memory_gb == 78.5 and both.sources["memory_gb"] == MEASURED
    assert gpu_figures(row.label, None, {"error": "boom"}) == row  # a failed measurement: the table
    # a device the table does not know is priced by what was measured, its link the collectives'
    cpu = gpu_figures("CPU-logical", None, {**node, "backend": "gloo"})
    assert cpu is not None and (cpu.link, cpu.link_gbs, cpu.busbw_gbs) == ("gloo", 360.0, 360.0)
    assert gpu_figures("CPU-logical", None, {**node, "allreduce_busbw_gbs": None}) is None  # not all known


@pytest.mark.gpu
def test_the_same_measurement_on_cuda_with_nccl():
    import torch

    n = torch.cuda.device_count()
    m = measure_node("cuda", n, env=_env())
    assert m["device"] == "cuda" and m["matmul_dtype"] == "bfloat16" and m["processes"] == n
    assert m["matmul_tflops"] > 0 and m["memory_bandwidth_tbs"] > 0
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    assert 0 < m["allocatable_gib"] <= total and m["allocation_probe_gib"] == m["allocatable_gib"]
    if n > 1:
        assert m["backend"] == "nccl"
        assert m["allreduce_busbw_gbs"] == pytest.approx(m["allreduce_algbw_gbs"] * 2 * (n - 1) / n)
        assert m["allgather_busbw_gbs"] == pytest.approx(m["allgather_algbw_gbs"] * (n - 1) / n)
    else:
        assert m["backend"] is None and m["allreduce_busbw_gbs"] is None


def test_one_node_without_a_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert measure_between_nodes(None, "cpu") == (None, ONE_NODE) == (None, "not measured: one node")
    assert measure_between_nodes("local", "cpu") == (None, ONE_NODE)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_between_two_nodes_of_a_ray_cluster():
    """A real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``): one gloo rank
    a node, pinned there, the same collectives; then a one-node cluster says so."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        found, why = measure_between_nodes(cluster.address, "cpu")
    finally:
        cluster.shutdown()
    assert found is not None and why.startswith("measured between nodes "), why
    assert found["backend"] == "gloo" and found["processes"] == 2 and len(set(found["nodes"])) == 2
    assert found["allreduce_busbw_gbs"] == pytest.approx(found["allreduce_algbw_gbs"] * 2 * (2 - 1) / 2)
    assert found["allgather_busbw_gbs"] == pytest.approx(found["allgather_algbw_gbs"] * (2 - 1) / 2)
    assert found["allreduce_busbw_gbs"] > 0 and found["allgather_busbw_gbs"] > 0
    single = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        single.wait_for_nodes()
        assert measure_between_nodes(single.address, "cpu") == (None, ONE_NODE)
    finally:
        single.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_doctor_cli_records_what_its_json_says_and_estimate_prices_with_it(tmp_path):
    """``explorer doctor --json`` on a one-configuration CPU study (real processes): the JSON's
    ``measured`` is what the study records, and ``explorer estimate`` says it priced with it."""
    from explorer.record import StudyRecord
    from explorer.study import load_readonly
    from tests.builders import run_cli

    loaded = _loaded(tmp_path)
    raw = yaml.safe_load(loaded.file.read_text())
    raw["search_space"] = {"parameters": {"batch_size": 4, "number_gpus": 1, "gradient_checkpointing": False}}
    loaded.file.write_text(yaml.safe_dump(raw))
    proc = run_cli("doctor", str(loaded.file), "--json", timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout)["measured"]
    assert measured["backend"] == "gloo" and measured["allreduce_busbw_gbs"] > 0
    assert StudyRecord.of(load_readonly(loaded)).measured_node("CPU-logical") == measured
    proc = run_cli("estimate", str(loaded.file), "--top", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{measured['matmul_tflops']:.4g} TFLOP/s float32" in proc.stdout
    assert "measured by explorer doctor" in proc.stdout


def test_optimize_searches_with_the_figures_the_doctor_recorded(cpu_node, tmp_path):
    """The default search's physics is priced with the node's recorded figures: ``optimize`` says
    so, and the joint models' estimates are the physics' with those figures, not the stand-in's."""
    import dataclasses

    import numpy as np

    from explorer.gpus import study_figures
    from explorer.search import make_strategy
    from explorer.search._physics import JobPhysics, physics_parts
    from explorer.study import optimize
    from explorer.study_file import load_study

    loaded = load_study(
        ROOT / "studies" / "quickstart.yaml",
        storage=f"sqlite:///{tmp_path}/table.db",
        replay_table=ROOT / "benchmarks" / "results" / "tables" / "cpu-quickstart.csv",
    )
    spec = loaded.spec.model_copy(update={"n_trials": 1})
    loaded = dataclasses.replace(loaded, spec=spec)
    said: list[str] = []
    optimize(loaded, printer=said.append, write_ahead=False)
    assert not any(line.startswith("search: the physics priced at") for line in said), said

    record_findings(loaded, _report(cpu_node, gpu_model=spec.resources.model))
    said.clear()
    optimize(dataclasses.replace(loaded, spec=spec.model_copy(update={"n_trials": 2})), printer=said.append)
    (line,) = [line for line in said if line.startswith("search: the physics priced at")]
    assert (
        f"{cpu_node['matmul_tflops']:.4g} TFLOP/s float32" in line and "measured by explorer doctor" in line
    )

    figures = study_figures(spec.resources, cpu_node)
    strategy = make_strategy(loaded.space, spec, per_gpu_ranked=True)
    assert strategy.price_with(figures)
    parts = strategy.local.encoding().parts  # type: ignore[attr-defined]
    configs = strategy.valid()
    expected = physics_parts(
        JobPhysics(workload=spec.workload, resources=spec.resources, figures=figures), configs
    )
    stand_in = physics_parts(JobPhysics(workload=spec.workload, resources=spec.resources), configs)
    assert (
        parts is not None
        and np.allclose(parts.time, expected.time)
        and np.allclose(parts.memory, expected.memory)
    )
    assert not np.allclose(parts.time, stand_in.time)


def test_a_measured_fabric_prices_the_collectives_that_cross_nodes(cpu_node, tmp_path):
    """A Ray cluster's measured between-nodes bus bandwidth replaces the assumed fabric for the
    configurations that span nodes; those within a node keep the node's link."""
    from explorer.gpus import describe_measured, study_figures
    from explorer.search._physics import INTER_NODE_BYTES_S, JobPhysics
    from explorer.study_file import load_study

    loaded = _loaded(tmp_path, device_memory_gib=None)
    raw = yaml.safe_load(loaded.file.read_text())
    raw["resources"].update(gpus_per_node=1, nodes=2)
    raw["search_space"] = {
        "parameters": {
            "batch_size": {"values": [4, 8]},
            "number_gpus": {"values": [1, 2]},
            "number_nodes": {"values": [1, 2]},
            "distributed_backend": {"choices": ["DDP", "FSDP"]},
            "fsdp_version": 2,
            "fsdp_sharding_strategy": "FULL_SHARD",
            "gradient_checkpointing": False,
        }
    }
    loaded.file.write_text(yaml.safe_dump(raw))
    loaded = load_study(loaded.file, check_model=False, check_launcher=False, check_hub=False)
    r = loaded.spec.resources
    slow = {"backend": "gloo", "allreduce_busbw_gbs": 0.01, "allgather_busbw_gbs": 0.005}
    alone, joined = study_figures(r, cpu_node), study_figures(r, {**cpu_node, "inter_node": slow})
    assert alone is not None and joined is not None
    assert alone.inter_node_gbs is None and joined.inter_node_gbs == pytest.approx(0.01)
    assert "between nodes 0.01 GB/s" in describe_measured(joined, cpu_node)
    before = JobPhysics(workload=loaded.spec.workload, resources=r, figures=alone)
    after = JobPhysics(workload=loaded.spec.workload, resources=r, figures=joined)
    assert before.fabric == INTER_NODE_BYTES_S and after.fabric == pytest.approx(0.01e9)
    configs = [c for c in loaded.space.enumerate() if c.distributed_backend != "NONE"]
    across = [c for c in configs if int(c.number_nodes) > 1]
    within = [c for c in loaded.space.enumerate() if int(c.number_nodes) == 1]
    assert across and within
    for c in across:  # the collectives at 0.01 GB/s instead of the node's link
        assert after.time_parts(c)[2] == pytest.approx(
            before.time_parts(c)[2] * before.link / 0.01e9, rel=1e-9
        )
    for c in within:
        assert after.time_parts(c) == pytest.approx(before.time_parts(c))


def test_node_only_measures_and_records_the_node_and_keeps_the_earlier_findings(cpu_node, tmp_path):
    """``explorer doctor --node-only``: the node measured for real (2 gloo processes), no smoke
    run, the figures recorded; the values this node, without CUDA, cannot run at all (flash
    attention) recorded invalid beside those an earlier doctor found, which stay."""
    from explorer.record import StudyRecord
    from explorer.study import load_readonly
    from explorer.study_file import load_study
    from tests.builders import run_cli

    path = _loaded(tmp_path, device="auto").file  # CUDA where there is one: flash attention may be asked for
    raw = yaml.safe_load(path.read_text())
    space = yaml.safe_load(Path(raw["search_space"]).read_text())
    space["parameters"]["attn_implementation"] = {"choices": ["sdpa", "flash_attention_2"]}
    raw["search_space"] = space
    path.write_text(yaml.safe_dump(raw))
    loaded = load_study(path, check_model=False, check_launcher=False, check_hub=False)
    earlier = _report(cpu_node)
    earlier.rows.append(
        Row(knob="batch_size", value=8, status=FAILED, detail="rank 0: boom", blocks=True, config="k")
    )
    record_findings(loaded, earlier)
    before = StudyRecord.of(load_readonly(loaded)).doctor
    assert before["invalid"]["CPU-logical"]
    proc = run_cli("doctor", str(loaded.file), "--node-only", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["measured"]["backend"] == "gloo"
    assert [(r["knob"], r["value"], r["status"], r["blocks"]) for r in data["rows"]] == [
        ("attn_implementation", "flash_attention_2", "not applicable", True)
    ]
    assert not list((loaded.output_dir / "doctor").glob("run-*"))  # no smoke run
    after = StudyRecord.of(load_readonly(loaded))
    invalid = after.doctor["invalid"]["CPU-logical"]
    assert invalid["batch_size"] == before["invalid"]["CPU-logical"]["batch_size"]
    assert set(invalid) == {"batch_size", "attn_implementation"}
    assert list(invalid["attn_implementation"]) == ['"flash_attention_2"']
    assert after.doctor["nodes"]["CPU-logical"]["counts"] == before["nodes"]["CPU-logical"]["counts"]
    assert (
        after.measured_node("CPU-logical") == data["measured"] != before["nodes"]["CPU-logical"]["measured"]
    )
    assert (
        "recorded with study 'quickstart': the node's figures; optimize records 2 values invalid"
        in proc.stderr
    )
