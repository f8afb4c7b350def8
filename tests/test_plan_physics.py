"""``explorer plan`` stays within physics on a table whose fit is above linear: an extrapolated
row never predicts more per-GPU throughput than was measured at the largest measured GPU count,
and an unbounded row is never "in time"."""

from __future__ import annotations

import math

import pytest

from explorer.plan import PlanJob
from explorer.plan._rows import PlanRow
from explorer.plan._scaling import ScalingPoint, fit_scaling
from explorer.trial_config import TrialConfig

# per-GPU throughput x1.79 per doubling (the study the problem was seen on): a family measured on
# 1 and 2 GPUs, twice each so that the fit has a band, and one measured on 2 GPUs only
ABOVE_LINEAR = [
    ScalingPoint(family="b16", strategy="DDP", number_gpus=1, number_nodes=1, per_gpu=3100.0),
    ScalingPoint(family="b16", strategy="DDP", number_gpus=1, number_nodes=1, per_gpu=3200.0),
    ScalingPoint(family="b16", strategy="DDP", number_gpus=2, number_nodes=1, per_gpu=5500.0),
    ScalingPoint(family="b16", strategy="DDP", number_gpus=2, number_nodes=1, per_gpu=5750.0),
    ScalingPoint(family="b32", strategy="DDP", number_gpus=1, number_nodes=1, per_gpu=4000.0),
    ScalingPoint(family="b32", strategy="DDP", number_gpus=2, number_nodes=1, per_gpu=7100.0),
]


def test_an_above_linear_fit_is_capped_at_the_largest_measured_count() -> None:
    fit = fit_scaling(ABOVE_LINEAR)
    (ddp,) = fit.strategies()
    assert ddp.per_doubling > 1.7  # the fit itself is above linear
    measured_at_2 = max(p.per_gpu for p in ABOVE_LINEAR if p.family == "b16" and p.number_gpus == 2)
    for gpus in (4, 8, 16):
        p = fit.predict(family="b16", strategy="DDP", number_gpus=gpus, number_nodes=1)
        assert p is not None and p.extrapolated
        assert p.per_gpu <= measured_at_2 + 1e-9 and p.high <= measured_at_2 + 1e-9
        assert p.low <= p.per_gpu <= p.high
        assert "capped at the per-GPU throughput measured at 2 GPUs" in p.note
    # within the measured range nothing is capped: the fit's own value
    inside = fit.predict(family="b16", strategy="DDP", number_gpus=2, number_nodes=1)
    assert inside is not None and "capped" not in inside.note


def test_a_below_linear_fit_is_left_as_it_is() -> None:
    points = [
        ScalingPoint(family=f, strategy="DDP", number_gpus=g, number_nodes=1, per_gpu=r)
        for f, g, r in [("a", 1, 1000.0), ("a", 1, 1010.0), ("a", 2, 930.0), ("a", 2, 925.0), ("b", 2, 800.0)]
    ]
    fit = fit_scaling(points)
    p = fit.predict(family="a", strategy="DDP", number_gpus=8, number_nodes=1)
    assert p is not None and p.per_gpu < 930.0 and "capped" not in p.note
    # the central value is the fit's: ln per_gpu falls by the same step per doubling
    (ddp,) = fit.strategies()
    mean_at_2 = math.exp((math.log(930.0) + math.log(925.0)) / 2)
    assert p.per_gpu == pytest.approx(mean_at_2 * ddp.per_doubling**2, rel=1e-9)


def test_an_unbounded_row_is_never_in_time() -> None:
    job = PlanJob(tokens=1e6, deadline_hours=1000.0)
    config = TrialConfig(
        batch_size=64,
        number_gpus=8,
        number_nodes=4,
        distributed_backend="DDP",
        gradient_checkpointing=False,
        model_max_length=128,
    )
    unbounded = PlanRow(study="s", gpu_model="H100", config=config, per_gpu=11171.0, low=0.0, high=11171.0)
    bounded = PlanRow(study="s", gpu_model="H100", config=config, per_gpu=11171.0, low=9000.0, high=11171.0)
    measured = PlanRow(study="s", gpu_model="H100", config=config, per_gpu=11171.0, trial=3)
    assert unbounded.hours(job) < 1.0  # fast at its centre, yet its slow end never finishes
    assert unbounded.meets(job) is False
    assert bounded.meets(job) is True and measured.meets(job) is True
    slow = PlanRow(study="s", gpu_model="H100", config=config, per_gpu=0.01, trial=3)
    assert slow.meets(job) is False
