"""`status` and `export` show each measured trial's interval: the 95% CI of its mean step time,
as a share of the mean (the throughput's relative interval)."""

from __future__ import annotations

import csv

import pytest

from explorer.cli import main
from explorer.measurement import Measurement, Outcome
from tests.builders import properties


def test_status_and_export_show_the_interval(write_study, tmp_path, capsys) -> None:
    from explorer.study import open_study
    from explorer.study._record import record_driver, record_outcome
    from explorer.study_file import load_study
    from explorer.trial_config import TrialConfig

    path = write_study({"storage": f"sqlite:///{tmp_path}/s.db", "output_dir": str(tmp_path / "runs")})
    study = open_study(load_study(path), create=True)
    for batch, rate, ci in [(4, 1000.0, 0.013), (8, 1800.0, 0.21)]:
        trial = study.ask()
        config = TrialConfig(
            batch_size=batch,
            number_gpus=1,
            distributed_backend="NONE",
            gradient_checkpointing=False,
            model_max_length=64,
        )
        record_driver(trial, config, 0)
        record_outcome(
            study, trial, Measurement(outcome=Outcome.OK, properties=properties(rate, step_time_rel_ci=ci))
        )
    capsys.readouterr()
    assert main(["status", str(path)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:3]
    assert "+-1.3%" in rows[0] and "+-21.0%" in rows[1]
    out = tmp_path / "e.csv"
    assert main(["export", str(path), "--out", str(out)]) == 0
    with out.open(newline="") as fh:
        exported = list(csv.DictReader(fh))
    assert [float(r["step_time_rel_ci"]) for r in exported] == pytest.approx([0.013, 0.21])
