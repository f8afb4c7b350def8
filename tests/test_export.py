"""explorer export (issue 5): ado's columns, CSV and JSON, one row per trial; a replay study on
the export of a real CPU study finds the same best configuration and value."""

from __future__ import annotations

import csv
import json
import subprocess

import pytest

from explorer.study import open_study, optimize
from explorer.study._record import config_of
from explorer.study_file import load_study
from tests.builders import run_cli


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args)


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_a_replay_of_the_export_finds_the_same_best(write_study, tmp_path, ray_local):
    space = {
        "parameters": {
            "batch_size": {"values": [4, 8, 512]},  # 512 runs out of the 0.5 GiB cap
            "number_gpus": 1,
            "gradient_checkpointing": {"choices": [False, True]},
        }
    }
    measured = write_study(
        {
            "storage": f"sqlite:///{tmp_path}/m.db",
            "n_trials": 6,
            "sampler": {"kind": "grid"},
            "search_space": space,
        },
        name="measured.yaml",
    )
    optimize(load_study(measured), printer=lambda _: None)
    study = open_study(load_study(measured), create=False)
    best = study.best_trial
    trials = study.get_trials(deepcopy=False)

    out_csv, out_json = tmp_path / "e.csv", tmp_path / "e.json"
    done = _cli("export", str(measured), "--format", "csv", "--out", str(out_csv))
    assert done.returncode == 0, done.stderr
    assert _cli("export", str(measured), "--format", "json", "--out", str(out_json)).returncode == 0
    with out_csv.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    header = list(rows[0])
    # ado's order: identifier, generatorid, experiment_id, parameters..., properties..., is_valid
    assert header[:3] == ["identifier", "generatorid", "experiment_id"]
    assert (
        header.index("batch_size")
        < header.index("dataset_tokens_per_second_per_gpu")
        < header.index("is_valid")
    )
    assert header[header.index("is_valid") + 1 : header.index("is_valid") + 3] == ["status", "trial"]
    assert [int(r["trial"]) for r in rows] == sorted(t.number for t in trials)  # one row per trial
    assert {r["status"] for r in rows} >= {"ok", "oom"}
    as_json = json.loads(out_json.read_text())
    assert [r["identifier"] for r in as_json] == [r["identifier"] for r in rows]
    assert all(set(r) <= set(header) for r in as_json)
    ok = [r for r in as_json if r["status"] == "ok"]
    assert ok and all(
        r["is_valid"] == 1 and isinstance(r["dataset_tokens_per_second_per_gpu"], float) for r in ok
    )
    assert max(r["dataset_tokens_per_second_per_gpu"] for r in ok) == best.value

    replay = write_study(
        {
            "name": "replayed",
            "storage": f"sqlite:///{tmp_path}/r.db",
            "n_trials": 6,
            "sampler": {"kind": "grid"},
            "launcher": {"kind": "replay", "table": str(out_csv)},
            "search_space": space,
        },
        name="replay.yaml",
    )
    optimize(load_study(replay), printer=lambda _: None)
    again = open_study(load_study(replay), create=False).best_trial
    assert config_of(again) == config_of(best)
    assert again.value == best.value


def test_export_of_a_missing_study_is_one_line_and_writes_nothing(write_study, tmp_path):
    study = write_study({"storage": f"sqlite:///{tmp_path}/none.db"})
    out = tmp_path / "x.json"
    done = _cli("export", str(study), "--format", "json", "--out", str(out))
    assert done.returncode == 2 and "no study 'test'" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
