"""A study's identity (issue 22): one study never mixes two jobs.

Each case runs the real CLI on a real sqlite study (the replay of ``benchmarks/plan_studies``: real
CPU trials answered from their table in about a second), changes one thing that defines the job,
and runs ``optimize`` again: exit 2, one line naming the field with the stored and the new value,
and nothing written (the trials, the storage's bytes and the files around it are as they were). A
search space that only gains a value goes on.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from explorer.cli import main
from explorer.study import open_existing_study
from explorer.study_file import load_study

ROOT = Path(__file__).resolve().parent.parent
STUDY = "benchmarks/plan_studies/replay-cpu-small.yaml"
FILES = (
    "benchmarks/results/tables/cpu-two-models.csv",
    "search_spaces/plan-cpu.yaml",
    "studies/local-model/config.json",
    "studies/local-model/tokenizer.json",
    "studies/local-model/tokenizer_config.json",
    "studies/data/instructions.jsonl",
)
JSONL = {
    "model": {"name": "tiny-llama", "path": "../../studies/local-model"},
    "dataset": {"kind": "jsonl", "path": "../../studies/data/instructions.jsonl", "text_field": "text"},
}


def _write(
    root: Path, change: Callable[[dict[str, Any]], None] | None = None, *, jsonl: bool = False
) -> Path:
    """The replay study under ``root`` (with ``jsonl``: the local model and JSONL dataset), 4
    trials of batch sizes 8, 16 and 32 inline, then ``change``d."""
    for rel in FILES:
        if not (root / rel).exists():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, root / rel)
    data = yaml.safe_load((ROOT / STUDY).read_text())
    space = yaml.safe_load((ROOT / "search_spaces/plan-cpu.yaml").read_text())
    space["parameters"]["batch_size"] = {"values": [8, 16, 32]}
    data.update(n_trials=4, search_space={"parameters": space["parameters"]})
    if jsonl:
        data["workload"].update(copy.deepcopy(JSONL))  # the model replaced: no architecture
    if change is not None:
        change(data)
    path = root / STUDY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _snapshot(root: Path) -> tuple[int, dict[str, str]]:
    """The stored trials (counted through a connection closed at once, so that no WAL file is
    left open), and every file under ``root`` with its sha256."""
    import sqlite3

    files = {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }
    (db,) = root.glob("benchmarks/plan_studies/*.db")
    con = sqlite3.connect(db)
    try:
        (trials,) = con.execute("SELECT COUNT(*) FROM trials").fetchone()
    finally:
        con.close()
    return trials, files


def _other_dataset(data: dict[str, Any]) -> None:
    data["workload"]["dataset"]["path"] = "../../studies/data/other.jsonl"


def _longer(data: dict[str, Any]) -> None:
    data["workload"]["model_max_length"] = 256


def _deeper(data: dict[str, Any]) -> None:
    data["workload"]["model"]["architecture"]["num_hidden_layers"] = 4


@pytest.mark.parametrize(
    ("change", "jsonl", "field", "stored", "new"),
    [
        (_other_dataset, True, "workload.dataset.path", "instructions.jsonl", "other.jsonl"),
        (_longer, False, "workload.model_max_length", "128", "256"),
        (_deeper, False, "workload.model.architecture.num_hidden_layers", "2", "4"),
    ],
    ids=["dataset-path", "sequence-length", "architecture"],
)
def test_a_changed_job_is_refused_and_nothing_is_written(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: Any,
    jsonl: bool,
    field: str,
    stored: str,
    new: str,
) -> None:
    path = _write(tmp_path, jsonl=jsonl)
    assert main(["optimize", str(path)]) == 0
    # the run closed every connection it opened (its summary's too): sqlite's WAL is folded into
    # the file and removed now, not when the connections are collected, which happened during the
    # refused run below on a loaded machine (the -wal and -shm files vanished there)
    assert not [*tmp_path.rglob("*.db-wal"), *tmp_path.rglob("*.db-shm")], "a connection left open"
    (tmp_path / "studies/data/other.jsonl").write_bytes(
        (tmp_path / "studies/data/instructions.jsonl").read_bytes()
    )
    before = _snapshot(tmp_path)
    assert before[0] >= 4
    _write(tmp_path, change, jsonl=jsonl)
    before = before[0], {**before[1], STUDY: _snapshot(tmp_path)[1][STUDY]}  # the changed file itself
    capsys.readouterr()
    assert main(["optimize", str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert f"{path}: {field}: the stored study 'plan-replay-cpu-small' measured " in line, line
    assert stored in line.split("measured ")[1].split(", this file says")[0], line
    assert new in line.split("this file says ")[1], line
    assert "another study name" in line and "optuna delete-study --study-name plan-replay-cpu-small" in line
    assert _snapshot(tmp_path) == before


def test_a_dataset_changed_in_place_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, jsonl=True)
    assert main(["optimize", str(path)]) == 0
    data = tmp_path / "studies/data/instructions.jsonl"
    data.write_text(data.read_text().splitlines()[0] + "\n")  # the same path, other entries
    capsys.readouterr()
    assert main(["optimize", str(path), "--n-trials", "6"]) == 2
    assert ": workload.dataset.sha256: the stored study" in capsys.readouterr().err


def test_an_added_search_space_value_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path)
    assert main(["optimize", str(path)]) == 0

    def wider(data: dict[str, Any]) -> None:
        data["search_space"]["parameters"]["batch_size"]["values"].append(64)
        data["n_trials"] = 6

    _write(tmp_path, wider)
    capsys.readouterr()
    assert main(["optimize", str(path)]) == 0, capsys.readouterr().err
    assert "trials done" in capsys.readouterr().out
    study = open_existing_study(load_study(path, check_model=False))
    assert len([t for t in study.trials if t.user_attrs.get("status")]) >= 6


def test_a_study_stored_before_identities_gets_one(tmp_path: Path) -> None:
    from explorer.study._identity import IDENTITY_ATTR

    path = _write(tmp_path)
    assert main(["optimize", str(path)]) == 0
    study = open_existing_study(load_study(path, check_model=False))
    assert study.user_attrs[IDENTITY_ATTR]["workload.model_max_length"] == 128
    study.set_user_attr(IDENTITY_ATTR, None)  # as a study written before this version
    _write(tmp_path, _longer)
    assert main(["optimize", str(path), "--n-trials", "5"]) == 0  # not refused: stored now
    study = open_existing_study(load_study(path, check_model=False))
    assert study.user_attrs[IDENTITY_ATTR]["workload.model_max_length"] == 256
