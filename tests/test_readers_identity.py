"""Every verb that reads a study checks the study file's job as ``optimize`` does: a file whose
model or memory cap changed since the trials ran is refused in one line, nothing written; and
``best`` chooses only among configurations of the file's (possibly narrowed) search space."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from explorer.cli import main
from tests.builders import replayed_plan_studies


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return replayed_plan_studies(tmp_path_factory.mktemp("identity"))[0]


def _variant(study: Path, name: str, change) -> Path:
    data = yaml.safe_load(study.read_text())
    change(data)
    path = study.with_name(name)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _hidden(data: dict) -> None:
    data["workload"]["model"]["architecture"]["hidden_size"] = 128


def _cap(data: dict) -> None:
    data["resources"]["device_memory_gib"] = 4.0


@pytest.mark.parametrize(  # the model's change for every reader; the cap's for two of them
    ("verb", "change"),
    [(v, _hidden) for v in ("best", "report", "export", "status", "audit", "plan")]
    + [("best", _cap), ("status", _cap)],
)
def test_a_reader_refuses_a_file_of_another_job(
    replayed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, change
) -> None:
    changed = _variant(replayed, f"changed-{verb}-{change.__name__}.yaml", change)
    out = tmp_path / "out"
    extra = {
        "best": ["--out", str(out)],
        "report": ["--out", str(out)],
        "export": ["--out", str(out / "x.csv")],
    }
    extra["plan"] = ["--tokens", "1e8", "--out", str(out)]
    capsys.readouterr()
    assert main([verb, str(changed), *extra.get(verb, [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one study never mixes two jobs" in err[0], err
    assert ("hidden_size" in err[0] or "model" in err[0]) if change is _hidden else "memory" in err[0], err[0]
    assert not out.exists()  # nothing written


def test_best_chooses_within_a_narrowed_space(replayed: Path, tmp_path: Path, capsys) -> None:
    assert main(["best", str(replayed), "--out", str(tmp_path / "all")]) == 0
    everywhere = json.loads((tmp_path / "all" / "job.json").read_text())["config"]
    assert everywhere["number_gpus"] == 1  # the study's best (per GPU) runs on one
    space = yaml.safe_load((replayed.parent / replayed.name).read_text())["search_space"]
    narrowed_space = yaml.safe_load((replayed.parent / space).read_text())
    narrowed_space["parameters"]["number_gpus"] = {"values": [2]}
    (replayed.parent / "two-gpu-space.yaml").write_text(yaml.safe_dump(narrowed_space, sort_keys=False))
    narrowed = _variant(replayed, "narrowed.yaml", lambda d: d.update(search_space="two-gpu-space.yaml"))
    assert main(["best", str(narrowed), "--out", str(tmp_path / "one")]) == 0
    assert json.loads((tmp_path / "one" / "job.json").read_text())["config"]["number_gpus"] == 2
