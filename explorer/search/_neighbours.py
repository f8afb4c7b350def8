"""Local search: a start that covers the space, then the configurations next to the best ones,
proposed before TPE is asked.

The start-up trials are the frontier walk's (:mod:`explorer.search._frontier`) or, once it stops,
not drawn at random: each is the valid configuration with the largest share of parameter values
no earlier trial had (ties at random), so that five trials already see both checkpointing
settings, every backend, and the ends and middle of the batch range.

The spaces explorer searches are small and discrete, and their best configurations sit next to
other good ones: one step of batch size, one GPU count, checkpointing, the FSDP version or sharding
strategy away. After the start-up trials, the strategy (:mod:`explorer.search._strategies`)
asks :class:`LocalSearch` for an unanswered *neighbour* of the best few feasible configurations
(their neighbourhoods pooled) and the loop enqueues it; TPE is asked only when every neighbour of
the best few is answered (and, in the ``tpe-every-3`` strategy, every third trial).

A neighbour differs by one move:

* one step up or down an ordered parameter (batch size, sequence length, ...), or another value
  of an unordered one (backend, FSDP version, sharding strategy, checkpointing);
* another GPU count, at the same global batch and at the same per-device batch;
* a memory trade: checkpointing on with any larger batch, or off with any smaller one; more
  sharding with any larger batch (checkpointing typically buys a 2-8x larger batch).

Neighbours already measured, in flight, invalid, or inferred OOM (they dominate a known OOM, see
:mod:`explorer.search._inference`) are never proposed. The rest are ordered, first to last:

1. not predicted to run out of memory by the memory model fitted to the study's measured peaks
   (:mod:`explorer.search._memory_model`; none until 5 peaks are measured);
2. not capped below 98% of the best by a measured configuration that should be at least as fast
   per GPU (:mod:`explorer.search._throughput_prior`);
3. the rating of an additive model of log-throughput (one effect per parameter value and per
   per-device batch, fitted to the feasible trials; values never measured feasible rate as the
   best seen).

The first two only order: a neighbour they put last is still proposed when its turn comes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from explorer.gpus import Gpu
from explorer.knobs import Axis, Knob, knobs
from explorer.search._frontier import Modes, frontier_probe
from explorer.search._inference import inferred_oom
from explorer.search._memory_model import MemoryModels
from explorer.search._physics import JobPhysics
from explorer.search._surrogate import LOCAL_DISTANCE, Encoding, Surrogate
from explorer.search._threads import one_blas_thread
from explorer.search._throughput_prior import Ceilings
from explorer.space import SearchSpace
from explorer.space._domain import Fixed, Ordered, Value
from explorer.spec import ResourcesSpec, WorkloadSpec
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

if TYPE_CHECKING:
    import numpy as np

__all__ = ["SURROGATE", "LocalSearch"]

SURROGATE = True
"""Whether a new :class:`LocalSearch` proposes from the joint models after the frontier walk (the
default since issue 23; the ``walk`` strategy, :mod:`explorer.search._strategies`, turns it off for
its own: the walk, then neighbours of the best configurations)."""


CONTRAST = 1.10
"""A switch whose declared speed-up (:attr:`explorer.knobs.Knob.efficiency`) is this large or
larger is measured once both ways (:meth:`LocalSearch.contrast`)."""
CONTRAST_AFTER = 6
"""Feasible trials measured before a contrast: the first ones find what fits; a contrast then
tests the switch around a configuration the search has settled near."""
_CONTRASTED = [k for k in knobs() if k.kind == "bool" and k.efficiency]
"""The switches with a declared speed-up."""
UNCHECKPOINTED_AFTER = 3
"""Feasible trials, every one with activation checkpointing, after which the joint models' next
proposal is the best configuration without it (:meth:`LocalSearch.modelled_proposal`)."""
UNCHECKPOINTED_FIT = 0.2
"""The least chance to fit, by the memory model, of that configuration: with none as likely, the
study goes on as the models say."""


@dataclass(kw_only=True)
class LocalSearch:
    """Proposes unanswered neighbours of the best configurations found so far."""

    space: SearchSpace
    """The study's search space (its domains define the moves)."""
    resources: ResourcesSpec
    """What a configuration must fit (invalid ones are never proposed)."""
    elite: int = 3
    """How many of the best feasible configurations have their neighbourhoods searched."""
    memory_prior: bool = True
    """Order neighbours predicted to run out of memory last."""
    throughput_prior: bool = True
    """Order neighbours capped below 98% of the best by a faster measured configuration last."""
    frontier: bool = True
    """Start with the frontier walk (:mod:`explorer.search._frontier`) before covering the space."""
    surrogate: bool = field(default_factory=lambda: SURROGATE)
    """With both priors on: propose from the joint models of
    :mod:`explorer.search._surrogate` over the whole space instead of the walk and the neighbours
    (on by default: the ``walk`` strategy turns it off, see :data:`SURROGATE`)."""
    workload: WorkloadSpec | None = None
    """The job, for the joint models' first-principles priors (:mod:`explorer.search._physics`);
    ``None`` or a model without a known architecture: the registry's orders are the priors."""
    figures: Gpu | None = None
    """What prices the physics: the table's figures with those ``explorer doctor`` measured on the
    node over them (:func:`explorer.gpus.study_figures`); ``None``: the table's, or the CPU's
    stand-in."""
    _moves_cache: dict[TrialConfig, list[TrialConfig]] = field(default_factory=dict, repr=False)
    _valid: list[TrialConfig] = field(default_factory=list, repr=False)
    _modes: Modes | None = field(default=None, repr=False)
    _encoding: Encoding | None = field(default=None, repr=False)
    _keys: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def modelled(self) -> bool:
        """Whether the joint models propose (see :attr:`surrogate`)."""
        return self.surrogate and self.memory_prior and self.throughput_prior

    def encoding(self) -> Encoding:
        """The valid configurations, encoded once."""
        if self._encoding is None:
            self._encoding = Encoding.of(self.space, self.valid(), self._physics())
            self._keys = {c.key(): i for i, c in enumerate(self.valid())}
        return self._encoding

    @property
    def has_physics(self) -> bool:
        """Whether the job's architecture is known, so first-principles priors exist."""
        return self.workload is not None and bool(self.workload.model.architecture)

    def price_with(self, figures: Gpu | None) -> None:
        """Price the physics at ``figures`` (:attr:`figures`); encoded again when next asked."""
        self.figures = figures
        self._encoding = None

    def _physics(self) -> JobPhysics | None:
        if not self.has_physics:
            return None
        assert self.workload is not None
        return JobPhysics(workload=self.workload, resources=self.resources, figures=self.figures)

    def _modelled_pick(
        self,
        surrogate: Surrogate,
        answered: set[str],
        ooms: list[tuple[int, TrialConfig]],
        salt: str,
        local: TrialConfig | None = None,
        *,
        only: np.ndarray | None = None,
    ) -> TrialConfig | None:
        """The open configuration with the highest acquisition (not answered, not inferred OOM);
        ``only``: among these rows (a mask over the encoding's configurations) alone, or none."""
        import random

        import numpy as np

        enc = self.encoding()
        open_ = np.ones(len(enc.configs), dtype=bool)
        open_[[self._keys[k] for k in answered if k in self._keys]] = False
        if only is not None:
            open_ &= only
        rows = np.flatnonzero(open_)
        if not len(rows):
            return None
        near = (
            surrogate.distance(rows, enc.index[local]) <= LOCAL_DISTANCE
            if local is not None and len(answered) % 2
            else None
        )
        if near is not None and near.any():  # the others score -inf: only the near ones are scored
            score = np.full(len(rows), -np.inf)
            score[near] = surrogate.acquisition(rows[near])
        else:
            score = surrogate.acquisition(rows)
        jitter = np.random.default_rng(random.Random(salt).getrandbits(64)).random(len(rows))
        order = np.lexsort((jitter, -np.round(score, 12)))
        for i in order[:200]:
            c = enc.configs[rows[i]]
            if inferred_oom(c, ooms) is None:
                return c
        return enc.configs[rows[order[0]]] if only is None else None

    def propose(
        self,
        *,
        feasible: Iterable[tuple[TrialConfig, float]],
        answered: set[str],
        ooms: list[tuple[int, TrialConfig]],
        peaks: Iterable[tuple[TrialConfig, float]] = (),
    ) -> tuple[TrialConfig, TrialConfig] | None:
        """The neighbour to run next and the configuration it neighbours, or ``None``.

        Args:
            feasible: measured feasible configurations and their objective values.
            answered: keys of configurations answered or in flight (never proposed again).
            ooms: measured OOMs, for the inference filter and the memory model.
            peaks: measured per-device peak memory of feasible configurations, for the memory model.
        """
        ranked = sorted(feasible, key=lambda cv: cv[1], reverse=True)
        if not ranked:
            return None
        model = _AdditiveModel.fit(ranked)
        memory = MemoryModels.fit(list(peaks), [c for _, c in ooms]) if self.memory_prior else None
        ceilings = Ceilings.of(ranked) if self.throughput_prior else None
        floor = 0.98 * ranked[0][1]

        def order(c: TrialConfig) -> tuple[bool, bool, float]:
            fits = memory is None or memory.fits(c) is not False
            ceiling = ceilings.ceiling(c) if ceilings is not None else None
            return fits, ceiling is None or ceiling >= floor, model.predict(c)

        pool: dict[TrialConfig, TrialConfig] = {}  # candidate -> the best base it neighbours
        for base, _ in ranked[: self.elite]:
            for c in self.moves(base):
                if (
                    c not in pool
                    and c.key() not in answered
                    and invalid_reason(c, self.resources) is None
                    and inferred_oom(c, ooms) is None
                ):
                    pool[c] = base
        if not pool:
            return None
        chosen = max(pool, key=order)
        return chosen, pool[chosen]

    def probe(
        self,
        *,
        seen: Iterable[tuple[str, object]],
        seed: str,
        answered: set[str],
        ooms: list[tuple[int, TrialConfig]],
        fitted: Iterable[TrialConfig],
        last: TrialConfig | None,
    ) -> TrialConfig | None:
        """The frontier walk's next probe (:mod:`explorer.search._frontier`), or ``None``; with
        the joint models, the prior's best guess that is expected to fit."""
        return frontier_probe(
            space=self.space,
            valid=self.valid(),
            answered=answered,
            ooms=ooms,
            fitted=fitted,
            last=last,
            seen=set(seen),
            seed=seed,
            modes=self.modes(),
        )

    def modelled_proposal(
        self,
        *,
        feasible: Iterable[tuple[TrialConfig, float]],
        answered: set[str],
        ooms: list[tuple[int, TrialConfig]],
        peaks: Iterable[tuple[TrialConfig, float]] = (),
        fitted: Iterable[TrialConfig] = (),
        salt: str = "0",
    ) -> tuple[TrialConfig, str] | None:
        """The joint models' next configuration (:mod:`explorer.search._surrogate`) and what chose
        it: the open one with the highest acquisition (``model``); every other trial within
        ``LOCAL_DISTANCE`` of the best; once :data:`UNCHECKPOINTED_AFTER` feasible trials all had
        activation checkpointing, the best without it that has at least
        :data:`UNCHECKPOINTED_FIT` chance to fit (``uncheckpointed``). Trials with checkpointing
        keep each layer's input only, so they leave the physics' activation multiplier, which
        the configurations without it are priced by, nearly unmeasured; one trial measures it.

        Args:
            feasible: measured feasible configurations and their objective values.
            answered: keys of configurations answered or in flight (never proposed again).
            ooms: measured OOMs, for the inference filter and the memory model.
            peaks: measured per-device peak memory of feasible configurations.
            fitted: configurations known to fit, peak or not.
            salt: the tie-break's seed (the study's seed and the trial number).
        """
        ranked = sorted(feasible, key=lambda cv: cv[1], reverse=True)
        with one_blas_thread():
            surrogate = Surrogate.fit(
                self.encoding(),
                feasible=ranked,
                ooms=[c for _, c in ooms],
                fitted=list(fitted),
                peaks=list(peaks),
            )
            if self._checkpointed_only(ranked) and (
                c := self._modelled_pick(
                    surrogate, answered, ooms, salt, only=self._uncheckpointed(surrogate)
                )
            ):
                return c, "uncheckpointed"
            best = ranked[0][0] if ranked and ranked[0][0] in self.encoding().index else None
            c = self._modelled_pick(surrogate, answered, ooms, salt, best)
            return (c, "model") if c is not None else None

    def _checkpointed_only(self, ranked: list[tuple[TrialConfig, float]]) -> bool:
        """Whether enough trials are feasible and every one had activation checkpointing, in a
        space that has both settings."""
        domain = self.space.domains.get("gradient_checkpointing")
        return (
            domain is not None
            and len(domain.values) > 1
            and len(ranked) >= UNCHECKPOINTED_AFTER
            and all(getattr(c, "gradient_checkpointing", False) for c, _ in ranked)
        )

    def _uncheckpointed(self, surrogate: Surrogate) -> np.ndarray | None:
        """Which configurations are without checkpointing and likely enough to fit, or ``None``
        with no memory model."""
        import numpy as np
        from scipy.special import ndtr

        if surrogate.memory is None:
            return None
        enc = self.encoding()
        off = np.array([not c.gradient_checkpointing for c in enc.configs])
        mu, sd = surrogate.memory.predict(np.flatnonzero(off))
        off[np.flatnonzero(off)] = ndtr(-mu / sd) >= UNCHECKPOINTED_FIT
        return off

    def contrast(
        self,
        *,
        feasible: Iterable[tuple[TrialConfig, float]],
        answered: set[str],
        ooms: list[tuple[int, TrialConfig]],
    ) -> TrialConfig | None:
        """The best configuration with a switch flipped whose declared speed-up
        (:attr:`explorer.knobs.Knob.efficiency`, :data:`CONTRAST`) no measured pair has tested:
        the best measured has it on and no feasible trial has it off. A prior that large steers
        every proposal to one side, and trials on that side alone cannot tell the switch's
        effect from the rest of the calibration; one twin can. ``None``: nothing to contrast."""
        ranked = sorted(feasible, key=lambda cv: cv[1], reverse=True)
        if len(ranked) < CONTRAST_AFTER or not self.has_physics:
            return None
        best = ranked[0][0]
        for k in _CONTRASTED:
            domain = self.space.domains.get(k.name)
            value = getattr(best, k.name, None)
            if domain is None or len(domain.values) < 2 or k.efficiency.get(value, 1.0) < CONTRAST:
                continue
            if any(getattr(c, k.name, None) != value for c, _ in ranked):
                continue
            for twin in self._with(best, {k.name: not value}):
                if (
                    twin.key() not in answered
                    and invalid_reason(twin, self.resources) is None
                    and inferred_oom(twin, ooms) is None
                ):
                    return twin
        return None

    def modes(self) -> Modes:
        """The valid configurations by mode (:class:`~explorer.search._frontier.Modes`), built once."""
        if self._modes is None:
            self._modes = Modes(self.valid())
        return self._modes

    def valid(self) -> list[TrialConfig]:
        """Every valid configuration of the space (enumerated once)."""
        if not self._valid:
            self._valid.extend(c for c in self.space.enumerate() if invalid_reason(c, self.resources) is None)
        return self._valid

    def start(self, *, seen: Iterable[tuple[str, object]], seed: str) -> TrialConfig:
        """A start-up configuration that covers the space: the one with the largest share of its
        Optuna parameter values not ``seen`` in earlier trials (ties broken at random by ``seed``)."""
        import random

        seen = set(seen)
        configs = list(self.valid())
        random.Random(seed).shuffle(configs)

        def unseen(c: TrialConfig) -> float:
            params = self.space.params_for(c).items()
            return len(set(params) - seen) / max(1, len(params))

        return max(configs, key=unseen)

    def moves(self, config: TrialConfig) -> list[TrialConfig]:
        """Every configuration of the space one move away from ``config``."""
        if config not in self._moves_cache:
            seen = {config}
            out = []
            for c in self._moves(config):
                if c not in seen:
                    seen.add(c)
                    out.append(c)
            self._moves_cache[config] = out
        return self._moves_cache[config]

    def _moves(self, c: TrialConfig) -> Iterator[TrialConfig]:
        domains = {n: d for n, d in self.space.domains.items() if not isinstance(d, Fixed)}
        for name, domain in domains.items():
            current = getattr(c, name)
            if isinstance(domain, Ordered):
                options: list[Value] = list(_adjacent(domain.values, current))
            else:
                options = [v for v in domain.values if v != current]
            for value in options:
                yield from self._with(c, {name: value})
                if name == "number_gpus" and isinstance(value, int):
                    batch = c.per_device_batch_size * value
                    yield from self._with(c, {name: value, "batch_size": batch})
        batches = domains.get("batch_size")
        if not isinstance(batches, Ordered):
            return
        larger = [b for b in batches.values if isinstance(b, int) and b > c.batch_size]
        smaller = [b for b in batches.values if isinstance(b, int) and b < c.batch_size]
        traded = [k for k in knobs() if k.trade and k.name in domains]
        for k in sorted(traded, key=lambda k: k.kind != "bool"):  # the flips, then the steps
            yield from self._trades(c, k, larger, smaller)

    def _trades(
        self, c: TrialConfig, k: Knob, larger: list[int], smaller: list[int]
    ) -> Iterator[TrialConfig]:
        """Memory traded along ``k`` for batch size (see :attr:`explorer.knobs.Knob.trade`)."""
        value = getattr(c, k.name)
        if k.kind == "bool":
            saving = isinstance(k.memory, Axis) and k.memory.kind == "decreasing"
            for b in larger if value != saving else smaller:
                yield from self._with(c, {k.name: not value, "batch_size": b})
            return
        less = k.trade.step_down(value) if isinstance(k.trade, Axis) else None
        if less is not None:
            for b in larger:
                yield from self._with(c, {k.name: less, "batch_size": b})

    def _with(self, c: TrialConfig, changes: dict[str, Value]) -> Iterator[TrialConfig]:
        """``c`` with ``changes``; parameters that become active take each of their values."""
        base: dict[str, Value | None] = {}
        now = {**c.to_dict(), **changes}
        for name, domain in self.space.domains.items():
            value = changes.get(name, self.space.asked_value(name, now))
            base[name] = value if value in domain.values else None
        missing = [n for n, v in base.items() if v is None]
        for combo in itertools.product(*(self.space.domains[n].values for n in missing)):
            picks = {**base, **dict(zip(missing, combo, strict=True))}
            if any(picks[n] not in self.space.domains[n].values for n in changes):
                continue
            yield self.space._build(picks.__getitem__)  # type: ignore[arg-type]


def _adjacent(values: tuple[int, ...], current: object, step: int | None = None) -> list[int]:
    """The values next to ``current`` (below and above, or on one side)."""
    if current not in values:
        return []
    i = values.index(current)
    sides = (-1, 1) if step is None else (step,)
    return [values[i + s] for s in sides if 0 <= i + s < len(values)]


@dataclass(frozen=True)
class _AdditiveModel:
    """log(throughput) ~ mean + one effect per (parameter, value), each the mean residual of the
    feasible trials with that value; a value never measured feasible gets its parameter's best
    effect (optimism).

    Tried on the three benchmark tables and not kept (each was worse on two of them): a ridge
    regression on the same features, and weighting by the chance to fit (1 when a measured feasible
    configuration needs at least as much memory, else 0.5).
    """

    mean: float
    effects: dict[tuple[str, object], float]
    best_effect: dict[str, float]

    @classmethod
    def fit(cls, ranked: list[tuple[TrialConfig, float]]) -> _AdditiveModel:
        logs = [(c, math.log(max(v, 1e-9))) for c, v in ranked]
        mean = sum(y for _, y in logs) / len(logs)
        sums: dict[tuple[str, object], list[float]] = {}
        for c, y in logs:
            for key in _features(c):
                sums.setdefault(key, []).append(y - mean)
        effects = {k: sum(v) / len(v) for k, v in sums.items()}
        best: dict[str, float] = {}
        for (name, _), e in effects.items():
            best[name] = max(best.get(name, -math.inf), e)
        return cls(mean=mean, effects=effects, best_effect=best)

    def predict(self, c: TrialConfig) -> float:
        """Predicted log-throughput of ``c``."""
        return self.mean + sum(
            self.effects.get(key, self.best_effect.get(key[0], 0.0)) for key in _features(c)
        )


def _features(c: TrialConfig) -> list[tuple[str, object]]:
    """The additive model's features: one per knob that declares one (knobs naming the same
    feature, the backend and its FSDP settings, make one tuple)."""
    grouped: dict[str, list[object]] = {}
    for k in knobs():
        if k.feature is not None:
            grouped.setdefault(k.feature or k.name, []).append(k.compared(c))
    return [(name, values[0] if len(values) == 1 else tuple(values)) for name, values in grouped.items()]
