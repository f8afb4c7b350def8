"""Per-GPU throughput against GPU count and nodes: a small documented scaling model.

The model (weak scaling: the per-device batch and every other knob are fixed; only the GPU count
and the nodes change). For each strategy s (``"DDP"``, ``"FSDP2 FULL_SHARD"``, ...) separately::

    ln(per_gpu) = alpha_f - a_s * log2(number_gpus) - b_s * log2(number_nodes) + e,   e ~ N(0, sd_s^2)

* ``alpha_f`` is one free level per *family* (the configuration with number_gpus and number_nodes
  left out): a fixed effect, so the fit is a within-family regression. Each family's log
  throughput and log2 counts are demeaned, and ``a_s`` (and ``b_s``) come from ordinary least
  squares on the demeaned values, pooled over the strategy's families. A family measured at one GPU
  count only fixes its own level; it adds nothing to the slope and no residual freedom.
* ``exp(-a_s)`` is the factor on per-GPU throughput per doubling of GPUs (0.93: -7% per doubling).
* The node term: ``log2(number_nodes)`` is 0 on one node and 1 on two, so on what is usually
  measured (1 or 2 nodes) it is the plain "crossed onto the network" step; beyond that each
  doubling of nodes costs the same factor ``exp(-b_s)`` (ring collectives stay bandwidth-bound on
  the slowest link, latency grows with the log of the ring), a milder and safer extrapolation than
  a cost linear in the nodes. It is fitted only when the strategy has points on more than one node
  count *and* nodes vary within families independently of the GPU count; otherwise ``b_s = 0``
  and a prediction off the family's measured nodes says ``"beyond the measured nodes: inter-node
  cost not measured"``.
* The band: the ordinary least-squares prediction interval in log space, Student t with the
  residual degrees of freedom ``dof = points - families - parameters``::

      var = sd^2 * (1 + 1/n_f + d' (X'X)^-1 d),   d = (log2 n - mean_f log2 n, log2 nodes - mean_f ...)

  where ``X`` is the demeaned design of the strategy and ``n_f`` the family's measured points; it
  is turned back into throughput with ``exp``. It widens with the distance (in doublings) from the
  family's measured counts. With no residual freedom (``dof = 0``) there is no band: the
  prediction keeps its central value, ``low = 0``, ``high = inf`` and the note
  ``"no residual freedom: no band"``.
* Past the family's largest measured GPU count, a central value above the best per-GPU throughput
  measured at that count (a slope fitted above linear) is capped there, and so is the band's upper
  end (``_ABOVE_LINEAR``); a fit below linear keeps its band as the regression gives it.
* ``predict`` marks a GPU count (or node count) outside the family's measured range as
  ``extrapolated``; a count inside it but not measured is noted as interpolated. It returns None
  when the strategy has no usable fit (no family measured at two GPU counts) or the family has no
  measured point under that strategy.

``held_back`` checks the model on points it was not fitted on: for each family measured at two or
more GPU counts, its largest GPU count is held back, the model is fitted on every other point, and
the held-back points are predicted (an extrapolation, the case that matters).

Pure numpy and scipy; no Optuna, no torch.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "NODES_UNMEASURED",
    "HeldBack",
    "HeldBackRow",
    "Prediction",
    "ScalingFit",
    "ScalingPoint",
    "StrategyFit",
    "fit_scaling",
    "held_back",
]

_EPS = 1e-12
_NO_BAND = "no residual freedom: no band"
NODES_UNMEASURED = "beyond the measured nodes: inter-node cost not measured"


@dataclass(frozen=True, kw_only=True)
class ScalingPoint:
    """One measured trial."""

    family: Hashable
    """The configuration with number_gpus and number_nodes left out (same per-device batch etc.)."""
    strategy: str
    """The distributed strategy, e.g. ``"DDP"``, ``"FSDP1 FULL_SHARD"``, ``"single GPU"``."""
    number_gpus: int
    """GPUs of the trial (all nodes together)."""
    number_nodes: int
    """Nodes the GPUs were spread over."""
    per_gpu: float
    """Measured dataset tokens/s per GPU (> 0)."""


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The model's per-GPU throughput for one family, strategy, GPU count and node count."""

    per_gpu: float
    """Central estimate, dataset tokens/s per GPU."""
    low: float
    """Lower end of the prediction band (at the fit's level); 0 without a band."""
    high: float
    """Upper end of the prediction band; inf without a band."""
    extrapolated: bool
    """True when number_gpus or number_nodes lies outside the family's measured range."""
    note: str = ""
    """Why the value deserves care ("; "-joined), e.g. the nodes were not measured."""


@dataclass(frozen=True, kw_only=True)
class StrategyFit:
    """The fitted scaling of one strategy."""

    strategy: str
    """The strategy's name."""
    per_doubling: float
    """Factor on per-GPU throughput per doubling of GPUs (``exp(-a)``)."""
    slope: float
    """Relative per-GPU throughput change per doubling of GPUs (``per_doubling - 1``)."""
    per_node_doubling: float | None
    """Factor per doubling of nodes at the same GPU count (``exp(-b)``); None when not fitted."""
    node_note: str
    """Why there is no node term ("" when there is one)."""
    points: int
    """Measured points of the strategy."""
    families: int
    """Families (configurations) among them."""
    dof: int
    """Residual degrees of freedom: points - families - fitted slopes."""
    residual_sd: float
    """Residual standard deviation in log space (about a relative error); nan when dof = 0."""
    gpus: tuple[int, ...]
    """The GPU counts measured under the strategy."""
    nodes: tuple[int, ...]
    """The node counts measured under the strategy."""

    def describe(self) -> str:
        """One human line."""
        text = f"{self.strategy}: per-GPU throughput x{self.per_doubling:.2f} per doubling of GPUs"
        if self.per_node_doubling is not None:
            text += f", x{self.per_node_doubling:.2f} per doubling of nodes"
        sd = "no residual freedom" if self.dof == 0 else f"residual sd {100 * self.residual_sd:.1f}%"
        text += f" ({self.points} points, {self.families} configurations, {sd}"
        return text + (f"; {self.node_note})" if self.node_note else ")")


@dataclass(frozen=True)
class _Family:
    """The sufficient statistics of one family's measured points under one strategy."""

    n: int
    mean: np.ndarray  # means of (log2 gpus, log2 nodes, ln per_gpu)
    scatter: np.ndarray  # 3 x 3 centred cross-products of the same
    gpus: frozenset[int]
    nodes: frozenset[int]
    ceiling: float  # the best measured per-GPU throughput at the family's largest GPU count

    @classmethod
    def of(cls, points: Sequence[ScalingPoint]) -> _Family:
        """The statistics of ``points`` (at least one)."""
        z = np.array(
            [[math.log2(p.number_gpus), math.log2(p.number_nodes), math.log(p.per_gpu)] for p in points]
        )
        mean = z.mean(axis=0)
        centred = z - mean
        return cls(
            n=len(points),
            mean=mean,
            scatter=centred.T @ centred,
            gpus=frozenset(p.number_gpus for p in points),
            nodes=frozenset(p.number_nodes for p in points),
            ceiling=max(p.per_gpu for p in points if p.number_gpus == max(q.number_gpus for q in points)),
        )


@dataclass(frozen=True)
class _Pool:
    """A strategy's pooled within-family statistics: the input of ``_solve``."""

    strategy: str
    scatter: np.ndarray
    points: int
    families: int
    gpus: Counter[int]
    nodes: Counter[int]


@dataclass(frozen=True)
class _Solution:
    """A solved strategy: coefficients on the demeaned (log2 gpus[, log2 nodes]) and the band."""

    summary: StrategyFit
    beta: np.ndarray
    inverse: np.ndarray  # (X'X)^-1 of the demeaned design
    sd: float
    t: float  # Student t quantile; nan when dof = 0
    nodes_fitted: bool


def _pool(strategy: str, families: Sequence[_Family]) -> _Pool:
    """Sum the families' statistics."""
    gpus: Counter[int] = Counter()
    nodes: Counter[int] = Counter()
    for f in families:
        gpus.update(f.gpus)
        nodes.update(f.nodes)
    return _Pool(
        strategy=strategy,
        scatter=sum((f.scatter for f in families), np.zeros((3, 3))),
        points=sum(f.n for f in families),
        families=len(families),
        gpus=gpus,
        nodes=nodes,
    )


def _node_term(pool: _Pool) -> str:
    """Why the node term cannot be fitted, or "" when it can."""
    if len([k for k, v in pool.nodes.items() if v > 0]) < 2:
        return "one node count measured: no node term"
    s = pool.scatter
    if s[1, 1] <= _EPS:
        return "nodes never vary within a configuration: no node term"
    if s[0, 0] * s[1, 1] - s[0, 1] ** 2 <= 1e-9 * s[0, 0] * s[1, 1]:
        return "nodes vary with the GPU count only: no separate node term"
    return ""


def _solve(pool: _Pool, level: float) -> _Solution | None:
    """Least squares on the pooled within-family statistics; None when no slope can be fitted."""
    s = pool.scatter
    if s[0, 0] <= _EPS:
        return None
    node_note = _node_term(pool)
    k = 1 if node_note else 2
    inverse = np.linalg.inv(s[:k, :k])
    beta = inverse @ s[:k, 2]
    rss = max(0.0, float(s[2, 2] - beta @ s[:k, 2]))
    dof = pool.points - pool.families - k
    sd = math.sqrt(rss / dof) if dof > 0 else math.nan
    t = float(stats.t.ppf((1 + level) / 2, dof)) if dof > 0 else math.nan
    summary = StrategyFit(
        strategy=pool.strategy,
        per_doubling=math.exp(beta[0]),
        slope=math.expm1(beta[0]),
        per_node_doubling=math.exp(beta[1]) if k == 2 else None,
        node_note=node_note,
        points=pool.points,
        families=pool.families,
        dof=dof,
        residual_sd=sd,
        gpus=tuple(sorted(g for g, v in pool.gpus.items() if v > 0)),
        nodes=tuple(sorted(n for n, v in pool.nodes.items() if v > 0)),
    )
    return _Solution(summary=summary, beta=beta, inverse=inverse, sd=sd, t=t, nodes_fitted=k == 2)


def _notes(
    solution: _Solution, family: _Family, number_gpus: int, number_nodes: int
) -> tuple[bool, list[str]]:
    """Whether (number_gpus, number_nodes) is outside the family's measured range, and why."""
    notes = []
    low, high = min(family.gpus), max(family.gpus)
    outside_gpus = not low <= number_gpus <= high
    if number_gpus > high:
        notes.append(f"beyond the measured GPUs (up to {high}) of this configuration")
    elif number_gpus < low:
        notes.append(f"below the measured GPUs (from {low}) of this configuration")
    elif number_gpus not in family.gpus:
        notes.append(f"interpolated: {number_gpus} GPUs not measured for this configuration")
    outside_nodes = not min(family.nodes) <= number_nodes <= max(family.nodes)
    if outside_nodes and not solution.nodes_fitted:
        notes.append(NODES_UNMEASURED)
    elif outside_nodes and not min(solution.summary.nodes) <= number_nodes <= max(solution.summary.nodes):
        notes.append("beyond the measured nodes: node term extrapolated")
    elif outside_nodes:
        notes.append("nodes not measured for this configuration: node term from other configurations")
    elif number_nodes not in family.nodes:
        notes.append(f"interpolated: {number_nodes} nodes not measured for this configuration")
    return outside_gpus or outside_nodes, notes


def _predict(solution: _Solution, family: _Family, number_gpus: int, number_nodes: int) -> Prediction:
    """The central value and band for one family at (number_gpus, number_nodes)."""
    k = len(solution.beta)
    d = (np.array([math.log2(number_gpus), math.log2(number_nodes)]) - family.mean[:2])[:k]
    centre = float(family.mean[2] + solution.beta @ d)
    extrapolated, notes = _notes(solution, family, number_gpus, number_nodes)
    if math.isnan(solution.t):
        low, high = 0.0, math.inf
        notes.append(_NO_BAND)
    else:
        half = solution.t * solution.sd * math.sqrt(1 + 1 / family.n + float(d @ solution.inverse @ d))
        low, high = math.exp(centre - half), math.exp(centre + half)
    per_gpu = math.exp(centre)
    if number_gpus > max(family.gpus) and per_gpu > family.ceiling:
        per_gpu, high = min(per_gpu, family.ceiling), min(high, family.ceiling)
        low = min(low, per_gpu)
        notes.append(f"capped at the per-GPU throughput measured at {max(family.gpus)} GPUs: {_ABOVE_LINEAR}")
    return Prediction(per_gpu=per_gpu, low=low, high=high, extrapolated=extrapolated, note="; ".join(notes))


_ABOVE_LINEAR = "more GPUs at the same per-device work never raise the per-GPU throughput"
"""Why an extrapolation past a family's largest measured GPU count is capped at what was measured
there: per-GPU throughput rises with the GPU count only while sharding frees memory for a larger
per-device batch, and a family keeps the per-device batch (weak scaling), so a fitted slope above
linear (per_doubling > 1) is noise or a memory effect that does not carry on."""


def _check(points: Sequence[ScalingPoint], level: float) -> None:
    """Refuse values the model cannot take."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), not {level}")
    for p in points:
        if not (math.isfinite(p.per_gpu) and p.per_gpu > 0):
            raise ValueError(f"per_gpu must be finite and > 0: {p}")
        if p.number_gpus < 1 or not 1 <= p.number_nodes <= p.number_gpus:
            raise ValueError(f"need 1 <= number_nodes <= number_gpus: {p}")


def _group(points: Sequence[ScalingPoint]) -> dict[str, dict[Hashable, list[ScalingPoint]]]:
    """Points by strategy, then family (first-seen order)."""
    groups: dict[str, dict[Hashable, list[ScalingPoint]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        groups[p.strategy][p.family].append(p)
    return groups


class ScalingFit:
    """The fitted model of every strategy (``fit_scaling``)."""

    level: float
    """The level of the prediction band, e.g. 0.9."""

    def __init__(self, points: Sequence[ScalingPoint], *, level: float) -> None:
        _check(points, level)
        self.level = level
        self._families: dict[tuple[str, Hashable], _Family] = {}
        self._solutions: dict[str, _Solution | None] = {}
        for strategy, families in _group(points).items():
            stats_ = {f: _Family.of(ps) for f, ps in families.items()}
            self._families.update({(strategy, f): s for f, s in stats_.items()})
            self._solutions[strategy] = _solve(_pool(strategy, list(stats_.values())), level)

    def predict(
        self, *, family: Hashable, strategy: str, number_gpus: int, number_nodes: int
    ) -> Prediction | None:
        """Per-GPU throughput of ``family`` under ``strategy``; None when the strategy has no usable
        fit or the family has no measured point under it."""
        solution = self._solutions.get(strategy)
        measured = self._families.get((strategy, family))
        if solution is None or measured is None:
            return None
        if number_gpus < 1 or not 1 <= number_nodes <= number_gpus:
            raise ValueError(f"need 1 <= number_nodes <= number_gpus, not {number_nodes} and {number_gpus}")
        return _predict(solution, measured, number_gpus, number_nodes)

    def strategies(self) -> list[StrategyFit]:
        """The strategies with a usable fit, by name."""
        return [s.summary for _, s in sorted(self._solutions.items()) if s is not None]

    def unfitted(self) -> list[str]:
        """The strategies with points but no usable fit (no family measured at two GPU counts)."""
        return sorted(k for k, s in self._solutions.items() if s is None)

    def describe(self) -> list[str]:
        """Human lines: one per strategy, fitted or not."""
        lines = [s.describe() for s in self.strategies()]
        return lines + [f"{k}: no fit (no configuration measured at two GPU counts)" for k in self.unfitted()]


def fit_scaling(points: Sequence[ScalingPoint], *, level: float = 0.9) -> ScalingFit:
    """Fit the scaling model (module docstring) to ``points``, separately per strategy."""
    return ScalingFit(points, level=level)


@dataclass(frozen=True, kw_only=True)
class HeldBackRow:
    """One held-back measured point and its prediction from the other points."""

    point: ScalingPoint
    """The measured point that was held back."""
    prediction: Prediction
    """The model's prediction, fitted without the point's GPU count for its family."""
    rel_error: float
    """``prediction.per_gpu / point.per_gpu - 1``."""
    inside_band: bool
    """Whether the measured value lies in ``[prediction.low, prediction.high]``."""


def _share(rows: Sequence[HeldBackRow]) -> float:
    """Share of rows inside a finite band; nan without any."""
    banded = [r.inside_band for r in rows if math.isfinite(r.prediction.high)]
    return sum(banded) / len(banded) if banded else math.nan


@dataclass(frozen=True, kw_only=True)
class HeldBack:
    """The model's error on measured points it was not fitted on (``held_back``)."""

    rows: list[HeldBackRow]
    """Every held-back point with its prediction."""
    mean_abs_rel_error: float
    """Mean of ``|rel_error|`` over the rows; nan without rows."""
    max_abs_rel_error: float
    """Largest ``|rel_error|``; nan without rows."""
    inside_band: float
    """Share of the rows with a band (dof > 0) whose measured value is inside it; nan without any."""
    level: float = 0.9
    """The level of the bands."""
    unpredicted: int = 0
    """Held-back points the others could not predict (their strategy had no slope left)."""

    def describe(self) -> list[str]:
        """Human lines: the summary, then one per strategy."""
        if not self.rows:
            return [f"held back: nothing to predict ({self.unpredicted} points without a fit)"]
        lines = [_summary_line("held back (largest GPU count of each configuration)", self.rows, self.level)]
        for strategy in sorted({r.point.strategy for r in self.rows}):
            lines.append(
                _summary_line(
                    f"  {strategy}", [r for r in self.rows if r.point.strategy == strategy], self.level
                )
            )
        if self.unpredicted:
            lines.append(f"  {self.unpredicted} held-back points could not be predicted (no slope left)")
        return lines


def _summary_line(head: str, rows: Sequence[HeldBackRow], level: float) -> str:
    """``head``: count, mean and max |error|, share inside the band."""
    errors = [abs(r.rel_error) for r in rows]
    share = _share(rows)
    band = "no band" if math.isnan(share) else f"{100 * share:.0f}% inside the {100 * level:.0f}% band"
    return (
        f"{head}: {len(rows)} points, mean |error| {100 * sum(errors) / len(errors):.1f}%, "
        f"max {100 * max(errors):.1f}%, {band}"
    )


def _held_back_family(
    pool: _Pool, whole: _Family, points: list[ScalingPoint], level: float
) -> tuple[list[HeldBackRow], int]:
    """Hold back the family's largest GPU count, refit the strategy without it, predict it."""
    top = max(p.number_gpus for p in points)
    held = [p for p in points if p.number_gpus == top]
    rest = _Family.of([p for p in points if p.number_gpus != top])
    reduced = _Pool(
        strategy=pool.strategy,
        scatter=pool.scatter - whole.scatter + rest.scatter,
        points=pool.points - len(held),
        families=pool.families,
        gpus=pool.gpus - Counter(whole.gpus) + Counter(rest.gpus),
        nodes=pool.nodes - Counter(whole.nodes) + Counter(rest.nodes),
    )
    solution = _solve(reduced, level)
    if solution is None:
        return [], len(held)
    rows = []
    for p in held:
        prediction = _predict(solution, rest, p.number_gpus, p.number_nodes)
        inside = prediction.low <= p.per_gpu <= prediction.high
        rows.append(
            HeldBackRow(
                point=p,
                prediction=prediction,
                rel_error=prediction.per_gpu / p.per_gpu - 1,
                inside_band=inside,
            )
        )
    return rows, 0


def held_back(points: Sequence[ScalingPoint], *, level: float = 0.9) -> HeldBack:
    """For each family measured at two or more GPU counts, hold back its largest GPU count, fit on
    every other point, and predict the held-back points: the model's extrapolation error."""
    _check(points, level)
    rows: list[HeldBackRow] = []
    unpredicted = 0
    for strategy, families in _group(points).items():
        stats_ = {f: _Family.of(ps) for f, ps in families.items()}
        pool = _pool(strategy, list(stats_.values()))
        for f, ps in families.items():
            if len(stats_[f].gpus) >= 2:
                found, missed = _held_back_family(pool, stats_[f], ps, level)
                rows += found
                unpredicted += missed
    errors = [abs(r.rel_error) for r in rows]
    return HeldBack(
        rows=rows,
        mean_abs_rel_error=sum(errors) / len(errors) if errors else math.nan,
        max_abs_rel_error=max(errors) if errors else math.nan,
        inside_band=_share(rows),
        level=level,
        unpredicted=unpredicted,
    )
