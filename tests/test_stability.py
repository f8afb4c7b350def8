"""Stability fractions and CV over repeats (ado's finetune_full_stability), and measure's config parsing."""

from __future__ import annotations

import pytest

from explorer.errors import SpecError
from explorer.measure import config_from_cli, with_measurement
from explorer.measurement import Measurement, Outcome
from explorer.stability import summarize
from explorer.study_file import load_study

from .test_dashboard import _props


def test_summarize_fractions_and_cv():
    ms = [
        Measurement(outcome=Outcome.OK, properties=_props(100.0)),
        Measurement(outcome=Outcome.OK, properties=_props(110.0)),
        Measurement(outcome=Outcome.OK, properties=_props(90.0)),
        Measurement(outcome=Outcome.OOM, error="oom"),
        Measurement(outcome=Outcome.FAILED, error="nccl"),
    ]
    s = summarize(ms)
    assert (s.n, s.f_gpu_oom, s.f_other_error, s.f_no_error) == (5, 0.2, 0.2, 0.6)
    assert s.mean == pytest.approx(100.0) and s.cv == pytest.approx(0.1)


def test_config_from_cli_defaults_and_errors(write_study):
    loaded = load_study(write_study())
    c = config_from_cli(
        loaded, sets=["batch_size=8", "number_gpus=2", "distributed_backend=FSDP"], config_file=None
    )
    assert (c.fsdp_version, c.fsdp_sharding_strategy, c.model_max_length) == (2, "FULL_SHARD", 64)
    single = config_from_cli(loaded, sets=["batch_size=8", "number_gpus=1"], config_file=None)
    assert single.distributed_backend == "NONE"
    with pytest.raises(SpecError, match="batch_sizes: unknown"):
        config_from_cli(loaded, sets=["batch_sizes=8"], config_file=None)
    with pytest.raises(SpecError, match="batch_size: .eight. is not an integer"):
        config_from_cli(loaded, sets=["batch_size=eight", "number_gpus=1"], config_file=None)
    with pytest.raises(SpecError, match="number_gpus: required"):
        config_from_cli(loaded, sets=["batch_size=8"], config_file=None)


def test_with_measurement_revalidates(write_study):
    loaded = load_study(write_study())
    steady = with_measurement(loaded, stop="steady", max_steps=50)
    assert steady.spec.measurement.rule == "steady" and steady.spec.measurement.max_steps == 50
    assert loaded.spec.measurement.rule == "steps"
    with pytest.raises(ValueError, match="stop_after_seconds"):
        with_measurement(loaded, stop="seconds")
