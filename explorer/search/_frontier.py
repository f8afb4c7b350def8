"""The frontier start: first try what should be fastest, and find the largest batch it fits.

Per-GPU throughput is highest with the fewest GPUs, no activation checkpointing and the least
sharding (the throughput prior, :mod:`explorer.search._throughput_prior`), and usually with the
largest per-device batch that fits. So before covering the space, the start-up trials walk down
from the top of that order:

* a *mode* is a configuration without its batch size (GPUs, backend, FSDP version and strategy,
  checkpointing, sequence length, ...); a mode is *open* while it has a valid configuration that
  is neither answered nor inferred OOM;
* the walk takes the open mode that no other mode dominates under the throughput prior (a mode
  counts while some batch of it is not OOM; when those are all searched out, the next ones
  down; ties: the one with the most parameter values no earlier trial had, then at random), and
  searches its batch sizes by bisection: the middle of its open batches; after a fit, the middle
  of those above the largest batch known to fit (measured, or by memory dominance); after an
  OOM, OOM inference takes the larger batches away. It stays in a mode until nothing above its
  largest fitting batch is left, then moves to the next mode;
* the walk ends, and the covering start (:meth:`LocalSearch.start`) takes over with its own
  start-up trials, as soon as a probe runs out of memory in a mode where nothing is known to fit:
  if even the fastest open mode does not fit a middle batch, memory is what shapes this space,
  and the start-up trials are better spent spread over it.

On a space where one device fits the model (the CPU table) the walk finds the best configuration
within the start-up trials; on a large model it costs one trial (the first probe's OOM).
State comes from the study's own trials (``proposed_by: frontier``), so a resumed study goes on
where it stopped.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from explorer.knobs import Axis, Rule, knobs
from explorer.search._inference import fits_by_dominance, inferred_oom
from explorer.space import SearchSpace
from explorer.trial_config import TrialConfig

__all__ = ["Modes", "SpeedViews", "frontier_probe", "frontier_stopped", "mode_of"]


def mode_of(c: TrialConfig) -> TrialConfig:
    """``c`` without its batch size: every mode is written with a per-device batch of 1."""
    return c.replace(batch_size=c.number_gpus)


def frontier_stopped(probes: Sequence[tuple[TrialConfig, str | None]]) -> bool:
    """Whether a probe ran out of memory in a mode that no earlier probe had shown to fit some
    batch (a fitted probe that needs at least the memory of the mode at a per-device batch of 1)."""
    fitted: list[tuple[int, TrialConfig]] = []
    for i, (config, status) in enumerate(probes):
        if status == "oom" and fits_by_dominance(mode_of(config), fitted) is None:
            return True
        if status == "ok":
            fitted.append((i, config))
    return False


def frontier_probe(
    *,
    space: SearchSpace,
    valid: Sequence[TrialConfig],
    answered: set[str],
    ooms: Sequence[tuple[int, TrialConfig]],
    fitted: Iterable[TrialConfig],
    last: TrialConfig | None,
    seen: set[tuple[str, object]],
    seed: str,
    modes: Modes | None = None,
) -> TrialConfig | None:
    """The next probe of the walk; ``None`` when no open mode is left to search.

    Args:
        space: the search space (for the covering tie-break).
        valid: every valid configuration of the space.
        answered: keys of configurations answered or in flight.
        ooms: measured OOMs (for OOM inference).
        fitted: measured feasible configurations.
        last: the previous probe, whose mode the walk stays in while it has batches to try.
        seen: Optuna parameter values of earlier trials (for the tie-break).
        seed: seeds the tie-break.
        modes: ``Modes(valid)``, kept by the caller between probes (built here when ``None``).
    """
    fit_proofs = [(0, c) for c in fitted]
    modes = Modes(valid) if modes is None else modes
    every = modes.every
    to_try: dict[TrialConfig, list[TrialConfig]] = {}
    alive = []  # modes with a batch not known to run out of memory
    for mode, configs in every.items():
        live = [c for c in configs if inferred_oom(c, ooms) is None]
        if live:
            alive.append(mode)
        known = [c.batch_size for c in configs if fits_by_dominance(c, fit_proofs) is not None]
        floor = max(known, default=0)
        open_ = [c for c in live if c.batch_size > floor and c.key() not in answered]
        if open_:
            to_try[mode] = sorted(open_, key=lambda c: c.batch_size)
    if not to_try:
        return None
    if last is not None and mode_of(last) in to_try:
        mode = mode_of(last)
    else:
        top = _undominated(to_try, alive, modes.views)
        if not top:  # the modes that dominate the rest are searched out: the next ones down
            top = _undominated(to_try, list(to_try), modes.views)
        random.Random(seed).shuffle(top)

        def unseen(m: TrialConfig) -> float:
            params = [(k, v) for k, v in space.params_for(m).items() if "batch" not in k]
            return len(set(params) - seen) / max(1, len(params))

        mode = max(top, key=unseen)
    batches = to_try[mode]
    return batches[len(batches) // 2]


class Modes:
    """Valid configurations grouped by mode, and the modes' speed views (:class:`SpeedViews`),
    built once a study."""

    def __init__(self, valid: Iterable[TrialConfig]) -> None:
        self.every: dict[TrialConfig, list[TrialConfig]] = {}
        """Mode -> its configurations, in the order given."""
        for c in valid:
            self.every.setdefault(mode_of(c), []).append(c)
        self.views = SpeedViews.of(list(self.every))


@dataclass(frozen=True)
class SpeedViews:
    """What dominance compares of each configuration, coded: along each knob whose speed order is
    an :class:`~explorer.knobs.Axis` (the value it compares) or a :class:`~explorer.knobs.Rule`
    (the fields it reads), the few distinct views are compared with each other once."""

    index: dict[TrialConfig, int]
    codes: np.ndarray
    """One row a tabulated knob, one column a configuration: its view's number."""
    tables: tuple[np.ndarray, ...]
    """For each tabulated knob, ``at_least[x, y]``: view ``x`` is at least as fast as view ``y``."""

    @classmethod
    def of(cls, configs: Sequence[TrialConfig]) -> SpeedViews:
        configs = list(dict.fromkeys(configs))
        codes, tables = [], []
        for k in knobs():
            order = k.speed
            if isinstance(order, Axis):
                views = [(type(v).__name__, v) for v in map(k.compared, configs)]  # True is not 1
            elif isinstance(order, Rule):
                views = [order.view(c) for c in configs]
            else:
                continue
            seen: dict[object, int] = {}
            coded = [seen.setdefault(v, len(seen)) for v in views]
            example = {code: c for code, c in zip(coded, configs, strict=True)}
            n = len(seen)
            tables.append(
                np.array(
                    [[k.speed_at_least(example[x], example[y]) for y in range(n)] for x in range(n)],
                    dtype=bool,
                )
            )
            codes.append(coded)
        return cls(
            index={c: i for i, c in enumerate(configs)},
            codes=np.array(codes, dtype=np.intp).reshape(len(codes), len(configs)),
            tables=tuple(tables),
        )

    def bits(self, modes: Sequence[TrialConfig], by: Sequence[TrialConfig]) -> np.ndarray:
        """Bits (``np.packbits``: a row for each of ``modes``, a bit for each of ``by``): whether
        that configuration of ``by`` is at least as fast as the row's along every tabulated knob
        (the AND, over the knobs, of the ``by`` configurations whose view is at least the row's)."""
        at_by = np.array([self.index[c] for c in by], dtype=np.intp)
        at_modes = np.array([self.index[c] for c in modes], dtype=np.intp)
        rows = np.full((len(modes), (len(by) + 7) // 8), 255, dtype=np.uint8)
        for codes, at_least in zip(self.codes, self.tables, strict=True):
            bits = np.packbits(at_least[codes[at_by]].T, axis=1)  # view y -> the by configurations at least y
            rows &= bits[codes[at_modes]]
        return rows


def _undominated(
    modes: Iterable[TrialConfig], by: Sequence[TrialConfig], views: SpeedViews | None = None
) -> list[TrialConfig]:
    """The ``modes`` (in order) that no other mode of ``by`` dominates under the throughput prior.

    The same as testing each mode against all of ``by`` with
    :func:`~explorer.search._throughput_prior.throughput_dominates`, but the tabulated knobs
    (:class:`SpeedViews`; ``views`` must hold every mode of both) are tested for every pair at
    once, and only the pairs that pass them are tested on any other knob's comparison, in Python,
    until one passes."""
    modes, by = list(modes), list(by)
    candidates = (views or SpeedViews.of([*by, *modes])).bits(modes, by)
    position = {o: j for j, o in enumerate(by)}
    for i, m in enumerate(modes):  # a mode does not dominate itself
        if (j := position.get(m)) is not None:
            candidates[i, j // 8] &= ~np.uint8(128 >> (j % 8))
    others = [k for k in knobs() if not isinstance(k.speed, (Axis, Rule))]
    if not others:
        dominated = np.asarray(candidates.any(axis=1), dtype=bool).tolist()
        return [m for m, d in zip(modes, dominated, strict=True) if not d]
    out = []
    for i, m in enumerate(modes):
        js = np.flatnonzero(np.unpackbits(candidates[i], count=len(by))).tolist()
        if not any(all(k.speed_at_least(by[j], m) for k in others) for j in js):
            out.append(m)
    return out
