"""The registered search strategies (``sampler.strategy``), each a :class:`Strategy` by name.

* :class:`Default` and its variants propose with :class:`~explorer.search._neighbours.LocalSearch`:
  the frontier walk while its probes fit, then the joint models (:mod:`explorer.search._surrogate`),
  or, for :class:`Walk` and :class:`NoPriors` (and for an objective not ranked as the per-GPU rate,
  which has no throughput prior), covering start-up trials and neighbours of the best;
* :class:`NoLocalSearch` leaves every trial to the study file's sampler;
* :class:`Random`, :class:`PlainTpe` and :class:`Gp` are Optuna's samplers with their defaults,
  the baselines ``benchmark-search`` compares with, without OOM inference.

The names are the variants ``benchmark-search`` reports, so that recorded results map onto them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from explorer.search._frontier import frontier_stopped
from explorer.search._neighbours import LocalSearch
from explorer.search._sampler import DEFAULT_STARTUP
from explorer.search._strategy import Proposal, Strategy, StudyState, register
from explorer.space import SearchSpace
from explorer.spec import StudySpec
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

    from explorer.gpus import Gpu

__all__ = [
    "FRONTIER",
    "CoverStart",
    "Default",
    "Gp",
    "NoInference",
    "NoLocalSearch",
    "NoPriors",
    "PlainTpe",
    "Random",
    "TpeEvery3",
    "Walk",
]

FRONTIER = "frontier"
"""What the frontier walk's proposals are tagged with (``proposed_by``)."""


@register
class Default(Strategy):
    """The frontier walk while its probes fit, then the joint models' choice over the whole space;
    the sampler when nothing is left open. Proposes only in front of TPE or GP."""

    name = "default"
    priors: ClassVar[bool] = True
    """The memory and throughput priors (both on: the joint models; off: the neighbour search)."""
    frontier: ClassVar[bool] = True
    """Start with the frontier walk."""
    surrogate: ClassVar[bool | None] = None
    """The joint models after the walk (``None``: :data:`explorer.search._neighbours.SURROGATE`)."""
    every: ClassVar[int] = 0
    """Every this many trials, the sampler's turn (0: only when nothing is left to propose)."""

    def __init__(self, *, space: SearchSpace, spec: StudySpec, per_gpu_ranked: bool) -> None:
        super().__init__(space=space, spec=spec, per_gpu_ranked=per_gpu_ranked)
        self.local = LocalSearch(
            space=space,
            resources=spec.resources,
            workload=spec.workload,
            memory_prior=self.priors,
            throughput_prior=self.priors and per_gpu_ranked,
            frontier=self.frontier and per_gpu_ranked,
        )
        if self.surrogate is not None:
            self.local.surrogate = self.surrogate
        sampler = spec.sampler
        self.startup = DEFAULT_STARTUP if sampler.n_startup_trials is None else sampler.n_startup_trials
        self.active = sampler.kind in ("tpe", "gp")

    def valid(self) -> list[TrialConfig]:
        """Local search's valid configurations (the same ones, enumerated once)."""
        return self.local.valid()

    def price_with(self, figures: Gpu | None) -> bool:
        """The joint models' physics priced at ``figures`` (see :meth:`Strategy.price_with`)."""
        self.local.price_with(figures)
        return self.local.modelled and self.local.has_physics

    def choose(self, state: StudyState) -> Proposal | None:
        """A start-up configuration (the frontier walk's probe, or one that covers the space), then
        the joint models' choice or an unanswered neighbour of the best configurations; ``None``
        (the sampler's turn) when none is left, or every :attr:`every`-th trial if set."""
        if not self.active:
            return None
        # the walk probes only within the start-up trials, so at most `startup` probes exist and the
        # start ends by 2 * startup: past that, no need to read the probes back on every ask
        probes = state.proposed(FRONTIER) if state.asked < 2 * self.startup else []
        walking = self.local.frontier and not frontier_stopped(probes)
        last = probes[-1][0] if probes else None
        if self.local.modelled:
            return self._modelled(state, walk=walking and state.asked < self.startup, last=last)
        if state.asked < self.startup + (0 if walking else len(probes)):
            return self._start(state, walking=walking, last=last)
        if not state.feasible or self._sampler_turn(state):
            return None
        proposal = self.local.propose(
            feasible=[(c, v) for c, v, _ in state.feasible.values()],
            answered=state.answered,
            ooms=state.ooms,
            peaks=state.peaks.values(),
        )
        if proposal is None:
            return None
        config, base = proposal
        return Proposal(config, f"neighbour of trial {state.feasible[base.key()][2]}")

    def _sampler_turn(self, state: StudyState) -> bool:
        return bool(self.every) and state.asked % self.every == 0

    def _seed(self, state: StudyState) -> str:
        return f"{self.spec.sampler.seed}:{state.asked}"

    def _probe(
        self, state: StudyState, seen: list[tuple[str, object]], last: TrialConfig | None
    ) -> Proposal | None:
        """The frontier walk's next probe, or ``None`` when it has none."""
        probe = self.local.probe(
            seen=seen,
            seed=self._seed(state),
            answered=state.answered,
            ooms=state.ooms,
            fitted=[c for c, _, _ in state.feasible.values()],
            last=last,
        )
        return Proposal(probe, FRONTIER) if probe is not None else None

    def _start(self, state: StudyState, *, walking: bool, last: TrialConfig | None) -> Proposal:
        """A start-up trial: the frontier walk's probe while it walks, else a covering one."""
        seen = state.params()
        probe = self._probe(state, seen, last) if walking else None
        return probe or Proposal(self.local.start(seen=seen, seed=self._seed(state)), "start")

    def _modelled(self, state: StudyState, *, walk: bool, last: TrialConfig | None) -> Proposal | None:
        """The joint models' proposal, after the frontier walk's probes while it walks (``walk``);
        the sampler's turn every :attr:`every`-th trial if set."""
        if walk and (probe := self._probe(state, state.params(), last)) is not None:
            return probe
        if self._sampler_turn(state):
            return None
        feasible = [(c, v) for c, v, _ in state.feasible.values()]
        if (
            twin := self.local.contrast(feasible=feasible, answered=state.answered, ooms=state.ooms)
        ) is not None:
            return Proposal(twin, "contrast")
        proposal = self.local.modelled_proposal(
            feasible=feasible,
            answered=state.answered,
            ooms=state.ooms,
            peaks=state.peaks.values(),
            fitted=[c for c, _, _ in state.feasible.values()],
            salt=self._seed(state),
        )
        return Proposal(*proposal) if proposal is not None else None


@register
class NoInference(Default):
    """:class:`Default` without OOM inference."""

    name = "no-inference"
    infers_oom = False


@register
class NoPriors(Default):
    """The neighbour search (the walk, covering start-up trials, neighbours of the best) without
    the memory and throughput priors that order the neighbours."""

    name = "no-priors"
    priors = False


@register
class CoverStart(Default):
    """:class:`Default` without the frontier walk: the joint models from the first trial."""

    name = "cover-start"
    frontier = False


@register
class TpeEvery3(Default):
    """:class:`Default` with every third trial from the sampler."""

    name = "tpe-every-3"
    every = 3


@register
class NoLocalSearch(Strategy):
    """The study file's sampler alone (with OOM inference)."""

    name = "no-local-search"


@register
class Random(Strategy):
    """Optuna's RandomSampler, no OOM inference."""

    name = "random"
    infers_oom = False

    def sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        return optuna.samplers.RandomSampler(seed=self.spec.sampler.seed)


@register
class PlainTpe(Strategy):
    """Optuna's TPESampler with its defaults (plain TPE), no OOM inference."""

    name = "optuna"
    infers_oom = False

    def sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        return optuna.samplers.TPESampler(seed=self.spec.sampler.seed)


@register
class Gp(Strategy):
    """Optuna's GPSampler with its defaults (categorical parameters one-hot, conditional ones
    sampled independently), no OOM inference."""

    name = "gp"
    infers_oom = False

    def sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        return optuna.samplers.GPSampler(seed=self.spec.sampler.seed, warn_independent_sampling=False)


@register
class Walk(Default):
    """The frontier walk, covering start-up trials, then unanswered neighbours of the best
    configurations ordered by the memory and throughput priors (the joint models off)."""

    name = "walk"
    surrogate = False
