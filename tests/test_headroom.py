"""Memory headroom: recomputed from each trial's raw stored peak and limit, a trial over its limit
never ranked, and the flag on a winner within ``memory_margin`` of its limit in best, report and
plan, with the best configuration that leaves the margin beside it."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest

from explorer.cli import main
from explorer.measurement import Measurement, Outcome, memory_headroom
from explorer.report import feasible_ranking, trial_headroom
from explorer.study import open_study
from explorer.study._record import record_driver, record_outcome
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import properties
from tests.conftest import BASE_STUDY

CAP = 0.5
TRIALS = [  # (batch size, value, peak GiB, stored limit GiB or None: a trial stored before limits)
    (16, 100.0, 0.49, CAP),  # the fastest: 2% headroom, under the 5% margin
    (8, 120.0, 0.52, CAP),  # faster still, but over its limit: never ranked
    (4, 95.0, 0.30, CAP),  # the best with headroom (40%)
    (2, 90.0, 0.20, None),  # no stored limit: the study's cap stands in
]


def _config(batch: int, gpus: int = 1) -> TrialConfig:
    return TrialConfig(batch_size=batch, number_gpus=gpus, gradient_checkpointing=False, model_max_length=64)


def _study(write_study, patch: dict | None = None) -> tuple[Path, optuna.Study]:
    # the file's space holds every batch size the trials ran (best chooses within the file's space)
    space = {
        "parameters": {**BASE_STUDY["search_space"]["parameters"], "batch_size": {"values": [2, 4, 8, 16]}}
    }
    path = write_study({"resources": {"device_memory_gib": CAP}, "search_space": space, **(patch or {})})
    study = open_study(load_study(path), create=True)
    for batch, value, peak, limit in TRIALS:
        trial = study.ask()
        record_driver(trial, _config(batch), 0)
        extra = {"memory_limit_gib": limit, "memory_headroom": memory_headroom(peak, limit)} if limit else {}
        props = properties(value, peak_memory_gib=peak, peak_memory_allocated_gib=peak, **extra)
        record_outcome(study, trial, Measurement(outcome=Outcome.OK, properties=props))
    return path, study


def test_headroom_is_recomputed_from_the_raw_stored_peak_and_limit(write_study):
    _, study = _study(write_study)
    for trial in study.get_trials():
        attrs = trial.user_attrs
        peak, limit = float(attrs["peak_memory_gib"]), attrs.get("memory_limit_gib")
        by_hand = 1.0 - peak / (float(limit) if limit is not None else CAP)
        assert trial_headroom(trial, CAP) == pytest.approx(by_hand, abs=1e-9)
        if limit is not None:  # the stored headroom is the same figure
            assert attrs["memory_headroom"] == pytest.approx(by_hand, abs=1e-9)
    ranked = [t.number for t in feasible_ranking(study)]
    assert ranked == [0, 2, 3]  # trial 1 peaked over its limit: it did not fit, whatever its speed


def _percent(text: str, label: str) -> float:
    found = re.search(rf"{label} (-?[\d.]+)%", text)
    assert found, text
    return float(found.group(1))


def test_best_flags_a_winner_near_the_limit_and_names_the_best_with_headroom(write_study, tmp_path, capsys):
    path, study = _study(write_study)
    assert main(["best", str(path), "--out", str(tmp_path / "best")]) == 0
    out = capsys.readouterr().out
    trials = study.get_trials()
    flag = next(line for line in out.splitlines() if line.startswith("near the memory limit"))
    assert "trial 0 peaked at 0.490 of 0.500 GiB" in flag and "5% memory_margin" in flag
    assert _percent(flag, "headroom") == pytest.approx(100 * (1 - 0.49 / 0.5), abs=0.06)
    alt = next(line for line in out.splitlines() if "with headroom:" in line)
    assert "trial 2," in alt and "bs=4" in alt
    assert _percent(alt, "headroom") == pytest.approx(100 * trial_headroom(trials[2], CAP), abs=0.06)
    behind = re.search(r"95\.0 \((-?[\d.]+)%\)", alt)
    assert behind and float(behind.group(1)) == pytest.approx(100 * (95.0 / 100.0 - 1), abs=0.06)


def test_the_margin_is_the_study_files(write_study, tmp_path, capsys):
    path, _ = _study(write_study, {"memory_margin": 0.01})  # 2% headroom is enough here
    assert main(["best", str(path), "--out", str(tmp_path / "best")]) == 0
    assert "near the memory limit" not in capsys.readouterr().out


def test_report_flags_it_on_its_page_and_its_output(write_study, tmp_path, capsys):
    path, _ = _study(write_study)
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "near the memory limit: trial 0" in out and "with headroom: trial 2" in out
    page = (tmp_path / "report" / "index.html").read_text()
    assert 'id="memory-flag"' in page and "with headroom: trial 2" in page


def test_plan_flags_a_marked_row_near_the_limit(write_study, tmp_path, capsys):
    path, _ = _study(write_study)
    assert main(["plan", str(path), "--tokens", "1e6", "--out", str(tmp_path / "plan")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    fastest = next(i for i, line in enumerate(lines) if line.startswith("fastest:"))
    assert "trial 0" in lines[fastest]
    assert lines[fastest + 1].startswith("  near the memory limit: trial 0 left 2.0% headroom")
    assert lines[fastest + 2].startswith(
        "  with headroom: test#2, 1 x CPU-logical, 95 tok/s/GPU, headroom 40.0%"
    )
