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

from explorer.search._inference import fits_by_dominance, inferred_oom
from explorer.search._throughput_prior import speed_group, speed_score, throughput_dominates
from explorer.space import SearchSpace
from explorer.trial_config import TrialConfig

__all__ = ["frontier_probe", "frontier_stopped", "mode_of"]


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
    """
    fit_proofs = [(0, c) for c in fitted]
    every: dict[TrialConfig, list[TrialConfig]] = {}
    for c in valid:
        every.setdefault(mode_of(c), []).append(c)
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
        top = _undominated(to_try, alive)
        if not top:  # the modes that dominate the rest are searched out: the next ones down
            top = _undominated(to_try, list(to_try))
        random.Random(seed).shuffle(top)

        def unseen(m: TrialConfig) -> float:
            params = [(k, v) for k, v in space.params_for(m).items() if "batch" not in k]
            return len(set(params) - seen) / max(1, len(params))

        mode = max(top, key=unseen)
    batches = to_try[mode]
    return batches[len(batches) // 2]


def _undominated(modes: Iterable[TrialConfig], by: Sequence[TrialConfig]) -> list[TrialConfig]:
    """The ``modes`` (in order) that no other mode of ``by`` dominates under the throughput prior.

    The same as testing each mode against all of ``by``, but a mode is first tested against a
    few remembered dominators: each found dominator is climbed (its own dominator, and so on) to a
    mode that dominates many, so that thousands of modes are not a quadratic scan; and only modes
    of its own :func:`speed_group` whose :func:`speed_score` is at least its own can dominate it,
    so only those are scanned (which dominator is found changes nothing of the result)."""
    modes = list(modes)
    every = {*by, *modes}
    group = {o: speed_group(o) for o in every}
    score = {o: speed_score(o) for o in every}
    groups: dict[tuple[object, ...], list[TrialConfig]] = {}
    for o in sorted(by, key=lambda o: -score[o]):
        groups.setdefault(group[o], []).append(o)

    def dominator(m: TrialConfig) -> TrialConfig | None:
        for o in groups.get(group[m], ()):
            if score[o] < score[m] - 1e-9:
                return None
            if o != m and throughput_dominates(o, m):
                return o
        return None

    recent: list[TrialConfig] = []
    out = []
    for m in modes:
        if any(o != m and throughput_dominates(o, m) for o in recent):
            continue
        hit = dominator(m)
        if hit is None:
            out.append(m)
            continue
        for _ in range(_CLIMB):
            up = dominator(hit)
            if up is None or up in recent:
                break
            hit = up
        recent.insert(0, hit)
        del recent[_RECENT:]
    return out


_RECENT = 16
"""Dominating modes remembered by :func:`_undominated`."""
_CLIMB = 8
"""Most steps up from a found dominator (two distinct modes may dominate each other)."""
