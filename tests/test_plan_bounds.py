"""``explorer plan`` recommends only what it can bound, on as many nodes as the study has, and
writes files that match the row they were written for.

The quickstart study is filled with the trials of a real quickstart run on this machine (the run
of issue 22: every ok trial's configuration, per-GPU rate and peak, recorded through the same
``record_outcome`` the loop uses, under the study's 0.5 GiB cap); its FSDP2 fit has one point more
than it has configurations and slope: no residual freedom, so its 4- and 8-GPU extrapolations
have no band.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from explorer.best import render_accelerate, torchrun_command
from explorer.cli import main
from explorer.measurement import Measurement, Outcome, memory_headroom
from explorer.plan import make_plan, plan_job
from explorer.study import open_existing_study, open_study
from explorer.study._record import record_driver, record_outcome
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import properties

ROOT = Path(__file__).resolve().parents[1]
CAP = 0.5
QUICKSTART_RUN = [  # batch, GPUs, backend, FSDP version, strategy, checkpointing, tok/s/GPU, peak GiB
    (32, 1, "NONE", None, None, False, 3158.3, 0.298),
    (32, 2, "FSDP", 2, "SHARD_GRAD_OP", False, 5262.3, 0.181),
    (64, 2, "FSDP", 2, "SHARD_GRAD_OP", False, 8628.5, 0.304),
    (128, 2, "FSDP", 2, "SHARD_GRAD_OP", True, 8668.5, 0.518),  # over the cap: never a row
    (128, 2, "DDP", None, None, True, 5831.1, 0.520),
    (128, 2, "FSDP", 1, "SHARD_GRAD_OP", True, 4424.3, 0.522),
    (4, 2, "FSDP", 2, "SHARD_GRAD_OP", False, 1820.3, 0.078),
    (8, 2, "DDP", None, None, False, 3709.4, 0.089),
]


@pytest.fixture
def quickstart(tmp_path: Path) -> Path:
    """A copy of studies/quickstart.yaml (and its space), its storage holding the run's trials."""
    for rel in ("studies/quickstart.yaml", "search_spaces/quickstart.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    path = tmp_path / "studies" / "quickstart.yaml"
    loaded = load_study(path, check_model=False)
    assert loaded.spec.resources.nodes == 1 and loaded.spec.resources.gpus_per_node == 2
    study = open_study(loaded, create=True)
    for batch, gpus, backend, version, strategy, ckpt, per_gpu, peak in QUICKSTART_RUN:
        config = TrialConfig(
            batch_size=batch,
            number_gpus=gpus,
            distributed_backend=backend,
            fsdp_version=version,
            fsdp_sharding_strategy=strategy,
            gradient_checkpointing=ckpt,
            model_max_length=128,
        )
        trial = study.ask()
        record_driver(trial, config, 0)
        props = properties(
            per_gpu,
            dataset_tokens_per_second=per_gpu * gpus,
            peak_memory_gib=peak,
            memory_limit_gib=CAP,
            memory_headroom=memory_headroom(peak, CAP),
        )
        record_outcome(study, trial, Measurement(outcome=Outcome.OK, properties=props))
    return path


def test_the_quickstart_plan_marks_no_unbounded_row(quickstart: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "chosen"
    argv = ["plan", str(quickstart), "--tokens", "1e9", "--max-gpus", "8", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    table = [
        line
        for line in text.splitlines()
        if "CPU-logical" in line and ("#" in line or "extrapolated" in line)
    ]
    marked = [line for line in table if line[:3].strip()]
    assert marked and all(" (0-" not in line and "extrapolated" not in line for line in marked)
    # the unbounded rows are still shown: no low end, the high end capped at what was measured
    assert any(" (0-" in line and "(0-inf)" not in line for line in table)
    assert (
        "not marked (4 x CPU-logical, 8 x CPU-logical): unbounded: the FSDP2 SHARD_GRAD_OP fit has no "
        "residual freedom; measure FSDP2 SHARD_GRAD_OP at one more GPU count" in text
    )
    assert "needs 4 nodes, more than the 1 the study declares (resources.nodes)" in text

    loaded = load_study(quickstart, check_model=False)
    job = plan_job([loaded.spec], tokens=1e9, max_gpus=8, file=str(quickstart))
    plan = make_plan([(loaded, open_existing_study(loaded))], job)
    for row in plan.rows:
        bounded = (
            row.trial is not None or (row.low or 0.0) > 0 and row.high is not None and row.high < float("inf")
        )
        assert row.markable == bounded
        if plan.marks.of(row):
            assert row.markable
        if row.config.number_nodes > loaded.spec.resources.nodes:
            assert "more than the 1 the study declares" in row.note
    chosen = plan.marks.chosen
    assert chosen is not None and chosen.trial is not None  # a measured row: 2 GPUs on one node

    # the files are the chosen row's: its GPUs, on its one node
    written = json.loads((out / "job.json").read_text())["config"]
    assert (written["number_gpus"], written["number_nodes"]) == (chosen.number_gpus, 1)
    launch = (out / "launch.sh").read_text()
    assert f"--standalone --nproc_per_node {chosen.number_gpus} " in launch and "--nnodes" not in launch
    assert yaml.safe_load((out / "accelerate.yaml").read_text())["num_machines"] == 1


def test_files_for_a_row_of_several_nodes_start_every_node(tmp_path: Path) -> None:
    config = TrialConfig(
        batch_size=64,
        number_gpus=8,
        number_nodes=4,
        distributed_backend="FSDP",
        fsdp_version=2,
        fsdp_sharding_strategy="SHARD_GRAD_OP",
        gradient_checkpointing=True,
        model_max_length=128,
    )
    command = torchrun_command(config, job_file=tmp_path / "job.json", steps=5)
    assert command.startswith('torchrun --nnodes 4 --nproc_per_node 2 --node_rank "$NODE_RANK"')
    assert "--standalone" not in command and '--master_addr "$MASTER_ADDR"' in command
    doc = yaml.safe_load(
        render_accelerate(
            config, device_type="cuda", torch_dtype="bfloat16", layer_classes=["LlamaDecoderLayer"]
        )
    )
    assert (doc["num_machines"], doc["num_processes"]) == (4, 8)


def test_only_a_finite_band_on_measured_nodes_bounds_an_extrapolation() -> None:
    from explorer.plan._rows import to_bound
    from explorer.plan._scaling import NODES_UNMEASURED, Prediction

    def prediction(low: float, high: float, note: str = "") -> Prediction:
        return Prediction(per_gpu=100.0, low=low, high=high, extrapolated=True, note=note)

    assert (
        to_bound(
            prediction(80.0, 120.0, "beyond the measured GPUs (up to 4) of this configuration"), "DDP", 1
        )
        == ""
    )
    no_band = to_bound(prediction(0.0, float("inf"), "no residual freedom: no band"), "DDP", 1)
    assert no_band.startswith(
        "unbounded: the DDP fit has no residual freedom; measure DDP at one more GPU count"
    )
    nodes = to_bound(prediction(80.0, 120.0, NODES_UNMEASURED), "FSDP2 FULL_SHARD", 4)
    assert nodes.startswith("unbounded: the inter-node cost of FSDP2 FULL_SHARD is not measured")
    assert "up to 4 nodes" in nodes
