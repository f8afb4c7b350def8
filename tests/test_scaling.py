"""The per-GPU scaling model of ``explorer/plan/_scaling.py``: slope, node term, band, held-back error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from explorer.plan._scaling import ScalingPoint, fit_scaling, held_back


def power_law(
    *,
    families: int = 3,
    gpus: tuple[int, ...] = (1, 2, 4, 8),
    factor: float = 0.9,
    node_factor: float = 1.0,
    gpus_per_node: int = 8,
    noise: float = 0.0,
    strategy: str = "DDP",
    seed: int = 0,
) -> list[ScalingPoint]:
    """Points of per_gpu = level_f * factor^log2(n) * node_factor^log2(nodes) * exp(noise)."""
    rng = np.random.default_rng(seed)
    points = []
    for f in range(families):
        for n in gpus:
            nodes = max(1, n // gpus_per_node)
            value = 1000.0 * (1 + f) * factor ** math.log2(n) * node_factor ** math.log2(nodes)
            value *= math.exp(noise * rng.standard_normal())
            points.append(
                ScalingPoint(
                    family=("f", f), strategy=strategy, number_gpus=n, number_nodes=nodes, per_gpu=value
                )
            )
    return points


def predict(fit, family=("f", 0), strategy="DDP", gpus=8, nodes=1):
    return fit.predict(family=family, strategy=strategy, number_gpus=gpus, number_nodes=nodes)


def test_recovers_a_known_slope_from_noisy_points():
    fit = fit_scaling(power_law(families=20, gpus=(1, 2, 4, 8, 16), gpus_per_node=16, noise=0.03, seed=1))
    (s,) = fit.strategies()
    assert s.per_doubling == pytest.approx(0.9, abs=0.015)
    assert s.slope == pytest.approx(s.per_doubling - 1)
    assert s.residual_sd == pytest.approx(0.03, rel=0.25)
    assert (s.points, s.families, s.dof) == (100, 20, 100 - 20 - 1)
    assert s.per_node_doubling is None and "one node count" in s.node_note


def test_exact_power_law_predicts_exactly_and_held_back_error_is_zero():
    points = power_law(families=3, factor=0.85)
    fit = fit_scaling(points)
    assert fit.strategies()[0].per_doubling == pytest.approx(0.85, rel=1e-12)
    p = predict(fit, family=("f", 1), gpus=64)
    assert p.per_gpu == pytest.approx(2000.0 * 0.85**6, rel=1e-9)
    back = held_back(points)
    assert len(back.rows) == 3 and {r.point.number_gpus for r in back.rows} == {8}
    assert back.mean_abs_rel_error == pytest.approx(0.0, abs=1e-9)
    assert back.max_abs_rel_error == pytest.approx(0.0, abs=1e-9)


def test_held_back_error_of_a_point_off_the_law_is_its_offset():
    """Family 1's 8-GPU point is 10% under the law; the rest lies on it: predicted / measured - 1
    for that point is 1 / 0.9 - 1, and it is an extrapolation."""
    points = [
        p
        if (p.family, p.number_gpus) != (("f", 1), 8)
        else ScalingPoint(**{**p.__dict__, "per_gpu": 0.9 * p.per_gpu})
        for p in power_law(families=3)
    ]
    back = held_back(points)
    (row,) = [r for r in back.rows if r.point.family == ("f", 1)]
    assert row.rel_error == pytest.approx(1 / 0.9 - 1, rel=1e-9)
    assert row.prediction.extrapolated and "beyond the measured GPUs (up to 4)" in row.prediction.note
    errors = [abs(r.rel_error) for r in back.rows]
    assert back.mean_abs_rel_error == pytest.approx(sum(errors) / 3)
    assert back.max_abs_rel_error == pytest.approx(max(errors))
    assert back.max_abs_rel_error > 0.1


def test_band_matches_the_dummy_variable_regression_and_widens_with_distance():
    points = power_law(families=4, gpus=(1, 2, 4), noise=0.05, seed=3)
    fit = fit_scaling(points, level=0.9)
    # the same model as one OLS with a dummy per family, and its textbook prediction interval
    x = np.array([[p.family[1] == f for f in range(4)] + [math.log2(p.number_gpus)] for p in points], float)
    y = np.log([p.per_gpu for p in points])
    coef, rss, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - x.shape[1]
    s2 = float(rss[0]) / dof
    t = stats.t.ppf(0.95, dof)
    widths = []
    for n in (1, 4, 8, 32, 256):
        x0 = np.array([0, 1, 0, 0, math.log2(n)], float)
        half = t * math.sqrt(s2 * (1 + x0 @ np.linalg.inv(x.T @ x) @ x0))
        got = predict(fit, family=("f", 1), gpus=n)
        assert got.per_gpu == pytest.approx(math.exp(x0 @ coef), rel=1e-9)
        assert got.low == pytest.approx(math.exp(x0 @ coef - half), rel=1e-9)
        assert got.high == pytest.approx(math.exp(x0 @ coef + half), rel=1e-9)
        widths.append(math.log(got.high / got.low))
    assert widths[2:] == sorted(widths[2:]) and widths[4] > 1.5 * widths[2]


def test_extrapolated_and_interpolated_flags():
    fit = fit_scaling(power_law(families=2, gpus=(2, 8), noise=0.01))
    measured = predict(fit, gpus=8)
    assert not measured.extrapolated and measured.note == ""
    inside = predict(fit, gpus=4)
    assert not inside.extrapolated and "interpolated: 4 GPUs" in inside.note
    above, below = predict(fit, gpus=16), predict(fit, gpus=1)
    assert above.extrapolated and "beyond the measured GPUs (up to 8)" in above.note
    assert below.extrapolated and "below the measured GPUs (from 2)" in below.note
    assert predict(fit, gpus=16).low < measured.low  # same family, further from its points


def test_no_node_term_without_multi_node_points_and_the_note_says_so():
    fit = fit_scaling(power_law(families=3, gpus=(1, 2, 4, 8), noise=0.01))
    assert fit.strategies()[0].per_node_doubling is None
    p = predict(fit, gpus=16, nodes=2)
    assert p.extrapolated and "beyond the measured nodes: inter-node cost not measured" in p.note


def test_node_term_is_fitted_with_multi_node_points():
    # 4 GPUs a node: 1..4 on one node, 8 on two, 16 on four; nodes cost x0.8 per doubling
    points = power_law(families=3, gpus=(1, 2, 4, 8, 16), gpus_per_node=4, node_factor=0.8)
    points += [
        ScalingPoint(
            family=p.family, strategy="DDP", number_gpus=8, number_nodes=8, per_gpu=p.per_gpu * 0.8**2
        )
        for p in points
        if p.number_gpus == 8
    ]
    fit = fit_scaling(points)
    (s,) = fit.strategies()
    assert s.per_doubling == pytest.approx(0.9, rel=1e-9)
    assert s.per_node_doubling == pytest.approx(0.8, rel=1e-9)
    assert s.node_note == "" and s.nodes == (1, 2, 4, 8)
    p = predict(fit, gpus=32, nodes=16)
    assert p.per_gpu == pytest.approx(1000 * 0.9**5 * 0.8**4, rel=1e-9)
    assert p.extrapolated and "node term extrapolated" in p.note


def test_nodes_that_move_with_the_gpu_count_give_no_separate_node_term():
    points = power_law(families=3, gpus=(8, 16, 32), gpus_per_node=8, noise=0.01)
    (s,) = fit_scaling(points).strategies()
    assert s.per_node_doubling is None and "vary with the GPU count" in s.node_note


def test_zero_residual_freedom_gives_no_band():
    fit = fit_scaling(power_law(families=1, gpus=(2, 4)))
    (s,) = fit.strategies()
    assert s.dof == 0 and math.isnan(s.residual_sd)
    p = predict(fit, gpus=8)
    assert p.per_gpu == pytest.approx(1000 * 0.9**3)
    assert (p.low, p.high) == (0.0, math.inf) and "no residual freedom: no band" in p.note
    assert "no residual freedom" in fit.describe()[0]


def test_held_back_band_covers_about_its_level_on_the_model_itself():
    back = held_back(power_law(families=300, gpus=(1, 2, 4, 8), noise=0.05, seed=7), level=0.9)
    assert len(back.rows) == 300
    assert back.inside_band == pytest.approx(sum(r.inside_band for r in back.rows) / 300)
    assert 0.84 <= back.inside_band <= 0.96
    assert 0.02 < back.mean_abs_rel_error < 0.1


def test_degenerate_inputs():
    single = [
        ScalingPoint(family=("f", f), strategy="single GPU", number_gpus=1, number_nodes=1, per_gpu=100.0 + f)
        for f in range(3)
    ]
    fit = fit_scaling(single)
    assert fit.strategies() == [] and fit.unfitted() == ["single GPU"]
    assert predict(fit, strategy="single GPU", gpus=1) is None
    assert "single GPU: no fit" in fit.describe()[0]
    back = held_back(single)
    assert back.rows == [] and math.isnan(back.mean_abs_rel_error) and math.isnan(back.inside_band)
    assert held_back([]).rows == [] and fit_scaling([]).describe() == []
    fit = fit_scaling(power_law(families=2))
    assert predict(fit, family=("f", 9)) is None and predict(fit, strategy="FSDP2 FULL_SHARD") is None
    # one family at two GPU counts: holding back the top leaves no slope
    back = held_back(power_law(families=1, gpus=(2, 4)))
    assert back.rows == [] and back.unpredicted == 1 and "nothing to predict" in back.describe()[0]
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            fit_scaling([ScalingPoint(family=0, strategy="DDP", number_gpus=2, number_nodes=1, per_gpu=bad)])
    with pytest.raises(ValueError):
        fit_scaling([ScalingPoint(family=0, strategy="DDP", number_gpus=2, number_nodes=4, per_gpu=1.0)])
    with pytest.raises(ValueError):
        fit_scaling([], level=1.0)


def test_strategies_are_fitted_separately_and_described():
    points = power_law(families=2, factor=0.9, noise=0.01, strategy="DDP")
    points += power_law(families=2, factor=0.7, noise=0.01, strategy="FSDP2 FULL_SHARD", seed=2)
    fit = fit_scaling(points)
    by_name = {s.strategy: s for s in fit.strategies()}
    assert by_name["DDP"].per_doubling == pytest.approx(0.9, abs=0.02)
    assert by_name["FSDP2 FULL_SHARD"].per_doubling == pytest.approx(0.7, abs=0.02)
    lines = fit.describe()
    assert lines[0].startswith("DDP: per-GPU throughput x0.9") and "8 points, 2 configurations" in lines[0]
    back = held_back(points)
    assert len(back.rows) == 4 and back.describe()[0].startswith("held back")
    assert any(line.strip().startswith("FSDP2 FULL_SHARD") for line in back.describe())
