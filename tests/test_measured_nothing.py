"""A run that measured nothing fails (issue 22): ``optimize`` exits non-zero with one line naming the
common cause when every trial it ended crashed (an OOM is a result); ``validate`` refuses what it can
see before any trial: here, a hub model id that cannot be reached from this machine.

The hub is never really reached: ``HF_HUB_OFFLINE`` with an empty cache, or ``HF_ENDPOINT`` at a
closed local port, stand for a machine without network.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from explorer.cli import main
from tests.builders import run_cli
from tests.conftest import BASE_STUDY, merge

ROOT = Path(__file__).resolve().parent.parent
HUB_ID = "explorer-tests/no-such-model"


def _hub_study(tmp_path: Path, **patch: Any) -> Path:
    data = merge(
        BASE_STUDY, {"workload": {"model": {"name": "hub-model", "architecture": None, "path": HUB_ID}}}
    )
    data = merge(data, patch | {"storage": f"sqlite:///{tmp_path}/s.db"})
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _offline(tmp_path: Path) -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"), "RAY_ADDRESS": ""}


def test_validate_refuses_a_hub_id_it_cannot_reach(tmp_path: Path) -> None:
    path = _hub_study(tmp_path)
    offline = run_cli("validate", str(path), env=_offline(tmp_path))
    assert offline.returncode == 2 and "Traceback" not in offline.stderr
    (line,) = offline.stderr.splitlines()
    assert f"{path}: workload.model.path: hub id {HUB_ID} is not in the local Hugging Face cache" in line
    assert "HF_HUB_OFFLINE" in line
    closed = run_cli(
        "validate",
        str(path),
        env={
            "HF_HOME": str(tmp_path / "hf-home"),
            "HF_ENDPOINT": "http://127.0.0.1:9",
            "HF_HUB_OFFLINE": "0",
        },
    )
    assert closed.returncode == 2 and "Traceback" not in closed.stderr
    (line,) = closed.stderr.splitlines()
    assert f"workload.model.path: cannot reach http://127.0.0.1:9 for hub id {HUB_ID}" in line
    # --offline checks the study elsewhere: the hub is not probed
    elsewhere = run_cli("validate", "--offline", str(path), env=_offline(tmp_path))
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert "the hub and the GPU were not probed" in elsewhere.stdout
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow  # real Ray trials that fail to load the model: in `make test-slow`
def test_optimize_past_validation_on_an_unreachable_hub_id_exits_non_zero(tmp_path: Path) -> None:
    path = _hub_study(tmp_path, n_trials=2, launcher={"max_retries": 0})
    proc = run_cli("optimize", "--no-hub-check", str(path), env=_offline(tmp_path), timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    ours = [x for x in proc.stderr.splitlines() if x.startswith("explorer:")]
    assert len(ours) == 1, proc.stderr
    assert ours[0].startswith(
        "explorer: this run measured nothing: its 2 trial(s) all failed; the common cause (2 of 2): "
    )
    assert "OSError" in ours[0] and "huggingface.co" in ours[0], ours[0]  # the worker's own words


def _replay(root: Path, batch_sizes: list[int]) -> Path:
    """The replay study of ``benchmarks/plan_studies`` (real CPU trials from their table) over
    ``batch_sizes``: a batch size the table lacks fails as a crash would; 64 runs out of memory."""
    for rel in ("benchmarks/results/tables/cpu-two-models.csv", "search_spaces/plan-cpu.yaml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    data = yaml.safe_load((ROOT / "benchmarks/plan_studies/replay-cpu-small.yaml").read_text())
    space = yaml.safe_load((ROOT / "search_spaces/plan-cpu.yaml").read_text())["parameters"]
    space.update(
        batch_size={"values": batch_sizes},
        number_gpus={"values": [1]},
        distributed_backend={"choices": ["DDP"]},
    )
    for knob in ("distributed_backend", "fsdp_version", "fsdp_sharding_strategy"):
        space.pop(knob)
    data.update(
        n_trials=2, search_space={"parameters": space}, launcher={**data["launcher"], "max_retries": 0}
    )
    path = root / "benchmarks/plan_studies/replay-cpu-small.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_run_whose_trials_all_crashed_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _replay(tmp_path, [12, 24])  # no row of the table: every trial fails
    assert main(["optimize", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "next: explorer report" not in out  # nothing to report on
    (line,) = [x for x in err.splitlines() if x.startswith("explorer:")]
    assert line.startswith(
        "explorer: this run measured nothing: its 2 trial(s) all failed; the common cause (1 of 2): "
        "not in the replay table cpu-two-models.csv"
    ), line


def test_a_run_of_oom_trials_is_a_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _replay(tmp_path, [64])  # a replayed OOM: infeasible, measured
    assert main(["optimize", str(path)]) == 0
    assert "measured nothing" not in capsys.readouterr().err
