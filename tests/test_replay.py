"""The replay launcher: trials answered from a recorded table (ado's CSV export layout).

``tests/data/ado_sample.csv`` is the four-row sample export printed in ado's documentation (seed 000).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from explorer.errors import SpecError
from explorer.launch import ReplayTable, launcher_for
from explorer.measurement import Outcome
from explorer.study import config_of, open_study, optimize, status_of
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import run_cli

ADO_SAMPLE = Path(__file__).resolve().parent / "data" / "ado_sample.csv"
A100 = "NVIDIA-A100-SXM4-80GB"


def _cfg(**kw) -> TrialConfig:
    base = dict(number_gpus=1, distributed_backend="NONE", gradient_checkpointing=False, model_max_length=128)
    return TrialConfig(**(base | kw))


def test_reads_ados_own_export():
    table = ReplayTable.read(ADO_SAMPLE, model_name="granite-3.1-2b", gpu_model=A100)
    assert len(table.rows) == 4 and len(ReplayTable.read(ADO_SAMPLE, model_name="granite-3.1-2b").rows) == 4
    m = table.measurement(_cfg(batch_size=2, model_max_length=512))  # not the 1024-token row of bs 2
    assert m.outcome is Outcome.OK and m.extra["replay_lines"] == [2]
    p = m.properties
    assert p is not None and p.dataset_tokens_per_second_per_gpu == pytest.approx(2744.108442306281)
    assert p.system["gpu_memory_utilization_peak"] == pytest.approx(31.498108)
    assert p.train_runtime == pytest.approx(31.3457) and math.isnan(p.mfu)  # not in the table: NaN
    absent = table.measurement(_cfg(batch_size=4, model_max_length=512))
    assert absent.outcome is Outcome.FAILED and "not in the replay table ado_sample.csv" in (
        absent.error or ""
    )


def _write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _row(bs: int, ckpt: bool, tput: float, valid: int = 1, **kw) -> dict:
    row = dict(
        model_name="tiny-llama",
        gpu_model="CPU-logical",
        model_max_length=64,
        number_gpus=1,
        batch_size=bs,
        gradient_checkpointing=ckpt,
        dataset_tokens_per_second_per_gpu=tput,
        is_valid=valid,
    )
    return row | kw


def test_invalid_rows_are_oom_and_repeats_take_the_median(tmp_path):
    path = _write(
        tmp_path / "t.csv",
        [
            _row(4, False, 100.0),
            _row(4, False, 130.0),
            _row(4, False, 120.0),
            _row(8, False, 0.0, valid=0),
            _row(8, True, 150.0, valid=0),
            _row(8, True, 140.0),
        ],
    )
    table = ReplayTable.read(path, model_name="tiny-llama", gpu_model="CPU-logical")
    ok = table.measurement(_cfg(batch_size=4, model_max_length=64))
    assert ok.outcome is Outcome.OK and ok.properties.dataset_tokens_per_second_per_gpu == 120.0
    oom = table.measurement(_cfg(batch_size=8, model_max_length=64))
    assert oom.outcome is Outcome.OOM and "is_valid=0" in (oom.error or "")
    mixed = table.measurement(_cfg(batch_size=8, gradient_checkpointing=True, model_max_length=64))
    assert mixed.outcome is Outcome.OK and mixed.properties.dataset_tokens_per_second_per_gpu == 140.0


def test_one_gpu_rows_match_whatever_backend_they_name(tmp_path):
    """ado writes distributed_backend=FSDP on 1-GPU rows too; a single GPU has no backend."""
    rows = [_row(4, False, 100.0, distributed_backend="FSDP", fsdp_sharding_strategy="FULL_SHARD")]
    rows.append(_row(4, False, 60.0, number_gpus=2, distributed_backend="DDP", fsdp_sharding_strategy=""))
    table = ReplayTable.read(_write(tmp_path / "t.csv", rows), model_name="tiny-llama")
    one = table.measurement(_cfg(batch_size=4, model_max_length=64))
    two = table.measurement(_cfg(batch_size=4, number_gpus=2, distributed_backend="DDP", model_max_length=64))
    assert one.properties.dataset_tokens_per_second_per_gpu == 100.0
    assert two.properties.dataset_tokens_per_second_per_gpu == 60.0


def test_a_row_that_does_not_parse_names_its_line(tmp_path):
    path = _write(tmp_path / "t.csv", [_row(4, False, 1.0), _row("eight", False, 1.0)])
    with pytest.raises(SpecError, match="line 3"):
        ReplayTable.read(path)


def test_float_and_boolean_knobs_round_trip(tmp_path):
    """checkpoint_fraction is a float column, liger_kernel a boolean one, however spelled."""
    rows = [
        _row(4, True, 100.0, checkpoint_fraction="0.5", liger_kernel="True"),
        _row(4, True, 90.0, checkpoint_fraction="1.0", liger_kernel="0"),
        _row(4, False, 80.0, checkpoint_fraction="", liger_kernel="false"),  # inactive: no fraction
    ]
    table = ReplayTable.read(_write(tmp_path / "t.csv", rows), model_name="tiny-llama")
    fraction = table.rows[0].params["checkpoint_fraction"]
    assert isinstance(fraction, float) and fraction == pytest.approx(0.5)
    assert [r.params["liger_kernel"] for r in table.rows] == [True, False, False]

    def tput(**kw) -> float:
        m = table.measurement(_cfg(batch_size=4, model_max_length=64, **kw))
        assert m.outcome is Outcome.OK, m.error
        return m.properties.dataset_tokens_per_second_per_gpu

    assert tput(gradient_checkpointing=True, checkpoint_fraction=0.5, liger_kernel=True) == pytest.approx(
        100.0
    )
    assert tput(gradient_checkpointing=True, checkpoint_fraction=1.0) == pytest.approx(90.0)
    assert tput(gradient_checkpointing=False) == pytest.approx(80.0)


def test_lookup_is_by_configuration_key(tmp_path):
    """Rows are indexed once by their configuration: a lookup finds them without scanning, and
    finds the same rows a scan would (repeats together, in table order)."""
    rows = [_row(bs, ckpt, float(bs + ckpt)) for bs in range(1, 201) for ckpt in (False, True)]
    rows.append(_row(7, True, 99.0))  # a repeat
    table = ReplayTable.read(_write(tmp_path / "t.csv", rows), model_name="tiny-llama")
    every = list(table.rows)
    table.rows = []  # the index answers alone
    for bs in (1, 7, 200):
        for ckpt in (False, True):
            found = table.lookup(_cfg(batch_size=bs, gradient_checkpointing=ckpt, model_max_length=64))
            scanned = [
                r for r in every if (r.params["batch_size"], r.params["gradient_checkpointing"]) == (bs, ckpt)
            ]
            assert found == scanned and len(found) == (2 if (bs, ckpt) == (7, True) else 1)
    assert table.lookup(_cfg(batch_size=201, model_max_length=64)) == []


def test_optimize_replays_a_study_without_running_anything(write_study, tmp_path):
    """A real Optuna study (sqlite) over a recorded table: no Ray, no worker process."""
    import ray

    recorded = {(bs, ckpt): (200.0 if ckpt else 300.0) - bs for bs in (4, 8, 16) for ckpt in (False, True)}
    recorded[(32, True)] = 150.0
    rows = [_row(bs, ckpt, tput) for (bs, ckpt), tput in recorded.items()]
    _write(tmp_path / "table.csv", [*rows, _row(32, False, 0.0, valid=0)])
    path = write_study(
        {
            "storage": f"sqlite:///{tmp_path}/s.db",
            "n_trials": 8,
            "launcher": {"kind": "replay", "table": "table.csv"},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4, 8, 16, 32, 64]},
                    "number_gpus": 1,
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
        }
    )
    loaded = load_study(path)
    assert type(launcher_for(loaded, output_dir=tmp_path)).__name__ == "ReplayLauncher"
    lines: list[str] = []
    optimize(loaded, printer=lines.append)
    assert not ray.is_initialized()
    study = open_study(loaded, create=False)
    by_status: dict[str, list] = {}
    for t in study.get_trials():
        by_status.setdefault(status_of(t), []).append(t)
    for t in by_status.get("ok", []):
        c = config_of(t)
        assert t.values[0] == recorded[(c.batch_size, c.gradient_checkpointing)]
    for t in by_status.get("oom", []):
        assert (config_of(t).batch_size, config_of(t).gradient_checkpointing) == (32, False)
    absent = [t for t in study.get_trials() if "not in the replay table" in str(t.user_attrs.get("error"))]
    assert all(config_of(t).batch_size == 64 for t in absent)
    assert by_status.get("ok"), lines


def test_an_export_replays_to_the_same_values(write_study, tmp_path):
    """explorer export writes ado's layout; the replay launcher reads it back unchanged."""

    recorded = {
        (bs, ckpt): 500.0 - bs - (50.0 if ckpt else 0.0) for bs in (4, 8, 16) for ckpt in (False, True)
    }
    rows = [_row(bs, ckpt, tput) for (bs, ckpt), tput in recorded.items()]
    _write(tmp_path / "table.csv", [*rows, _row(32, False, 0.0, valid=0), _row(32, True, 300.0)])
    space = {
        "parameters": {
            "batch_size": {"values": [4, 8, 16, 32]},
            "number_gpus": 1,
            "gradient_checkpointing": {"choices": [False, True]},
        }
    }
    first = write_study(
        {
            "storage": f"sqlite:///{tmp_path}/a.db",
            "n_trials": 8,
            "sampler": {"kind": "grid"},
            "launcher": {"kind": "replay", "table": "table.csv"},
            "search_space": space,
        },
        name="a.yaml",
    )
    optimize(load_study(first), printer=lambda _: None)
    export = tmp_path / "export.csv"
    done = run_cli("export", str(first), "--csv", str(export), timeout=120)
    assert done.returncode == 0, done.stderr
    header = export.read_text().splitlines()[0].split(",")
    assert {"identifier", "model_name", "gpu_model", "batch_size", "is_valid", "status"} <= set(header)
    original = ReplayTable.read(tmp_path / "table.csv", model_name="tiny-llama")
    again = ReplayTable.read(export, model_name="tiny-llama", gpu_model="CPU-logical")
    assert len(again.rows) == 8  # the grid measured every configuration once
    for bs in (4, 8, 16, 32):
        for ckpt in (False, True):
            config = _cfg(batch_size=bs, gradient_checkpointing=ckpt)
            a, b = original.measurement(config), again.measurement(config)
            assert a.outcome is b.outcome
            if a.properties is not None:
                assert (
                    b.properties.dataset_tokens_per_second_per_gpu
                    == a.properties.dataset_tokens_per_second_per_gpu
                )


def test_export_of_a_missing_study_is_one_line(write_study, tmp_path):

    study = write_study({"storage": f"sqlite:///{tmp_path}/none.db"})
    done = run_cli("export", str(study), "--csv", str(tmp_path / "x.csv"), timeout=120)
    assert done.returncode == 2 and "no study 'test'" in done.stderr and "Traceback" not in done.stderr
