"""The contract between the optimize loop and a search strategy, and the registry of strategies.

A :class:`Strategy` is asked, before each trial the loop asks Optuna for, for a proposal given
what the study knows (:class:`StudyState`); the loop enqueues it, else the strategy's Optuna
sampler (:meth:`Strategy.sampler`) picks the trial. A strategy is told nothing between asks:
each ask passes the study's state as every driver of the study recorded it, so a resumed or
shared study proposes what a fresh one would. The study file names one (``sampler.strategy``);
:func:`make_strategy` builds it. The strategies themselves are in
:mod:`explorer.search._strategies`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from explorer.search._inference import inferred_oom
from explorer.search._sampler import make_sampler
from explorer.space import SearchSpace
from explorer.spec import StudySpec
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

if TYPE_CHECKING:
    import optuna

    from explorer.gpus import Gpu

__all__ = [
    "EXPLORE_AFTER",
    "STRATEGY_CLASSES",
    "Proposal",
    "Strategy",
    "StudyState",
    "make_strategy",
    "register",
]

EXPLORE_AFTER = 1
"""With ``when_converged: explore``: after this many proposals in a row answered without running,
the next is an unanswered configuration drawn at random."""


@dataclass(frozen=True)
class Proposal:
    """A configuration to run next, and what proposed it (the trial's ``proposed_by``)."""

    config: TrialConfig
    by: str


@dataclass(frozen=True, kw_only=True)
class StudyState:
    """What a strategy sees of the study when it is asked (the loop fills it in)."""

    asked: int
    """Trials in the study, in every state (this driver's and the others')."""
    answered: set[str]
    """Keys of the configurations answered (measured, stored, failed for good) or in flight."""
    feasible: Mapping[str, tuple[TrialConfig, float, int]]
    """Key -> (configuration, objective value, higher is better, trial number) of the measured
    feasible ones."""
    ooms: list[tuple[int, TrialConfig]]
    """(trial number, configuration) of every measured OOM."""
    peaks: Mapping[str, tuple[TrialConfig, float]]
    """Key -> (configuration, per-device peak memory) of the feasible ones that report it."""
    streak: int
    """Proposals in a row answered without running (repeats, inferred OOMs)."""
    params: Callable[[], list[tuple[str, object]]]
    """Every trial's Optuna parameters (name, value), in trial order (read when called)."""
    proposed: Callable[[str], list[tuple[TrialConfig, str | None]]]
    """The asked trials a :class:`Proposal` with this ``by`` made, in order: (configuration,
    status, ``None`` while running); read when called."""


class Strategy:
    """A named search: what to run next, and the Optuna sampler behind it.

    Subclasses set :attr:`name` (one of :data:`explorer.spec._models.STRATEGIES`) and override
    :meth:`choose` (and :meth:`sampler`, :attr:`infers_oom` where they differ); :func:`register`
    makes them known by name.
    """

    name: ClassVar[str] = ""
    infers_oom: ClassVar[bool] = True
    """Whether the loop may answer a proposal that needs at least a known OOM's memory as OOM
    without running it (and the study file's ``infer_oom`` is on)."""

    def __init__(self, *, space: SearchSpace, spec: StudySpec, per_gpu_ranked: bool) -> None:
        """``per_gpu_ranked``: the study's first objective ranks configurations as the per-GPU
        rate does (the frontier walk and the throughput prior reason about that rate)."""
        self.space, self.spec, self.per_gpu_ranked = space, spec, per_gpu_ranked
        self._valid: list[TrialConfig] = []

    def sampler(self) -> optuna.samplers.BaseSampler:
        """The Optuna sampler, asked when :meth:`propose` has nothing: the study file's ``kind``."""
        return make_sampler(self.spec.sampler)

    def price_with(self, figures: Gpu | None) -> bool:
        """Price whatever physics the strategy reasons with at ``figures`` (the table's with the
        node's measured ones over them, :func:`explorer.gpus.study_figures`), before its first
        proposal; whether it reasons with any (the base strategy: no)."""
        return False

    def propose(self, state: StudyState) -> Proposal | None:
        """The configuration to run next, or ``None`` (the sampler's turn): with
        ``when_converged: explore`` once the study keeps proposing answered configurations, an
        unanswered one at random; else :meth:`choose`'s."""
        if self.spec.when_converged == "explore" and state.streak >= EXPLORE_AFTER:
            return self.unanswered(state)
        return self.choose(state)

    def choose(self, state: StudyState) -> Proposal | None:
        """This strategy's own proposal (``None``: the sampler's turn); here always the sampler."""
        return None

    def valid(self) -> list[TrialConfig]:
        """Every valid configuration of the space (enumerated once)."""
        if not self._valid:
            self._valid.extend(
                c for c in self.space.enumerate() if invalid_reason(c, self.spec.resources) is None
            )
        return self._valid

    def unanswered(self, state: StudyState) -> Proposal | None:
        """A random valid configuration not answered, in flight or inferred OOM; ``None`` when
        none is left (the loop's streak then stops the study)."""
        configs = self.valid()
        rng = random.Random(f"{self.spec.sampler.seed}:{state.asked}")
        for i in rng.sample(range(len(configs)), len(configs)):
            c = configs[i]
            if c.key() not in state.answered and inferred_oom(c, state.ooms) is None:
                return Proposal(c, "explore")
        return None


STRATEGY_CLASSES: dict[str, type[Strategy]] = {}
"""Every registered strategy, by name, in registration order."""


def register(cls: type[Strategy]) -> type[Strategy]:
    """Make ``cls`` known by its :attr:`~Strategy.name` (a class decorator)."""
    assert cls.name and cls.name not in STRATEGY_CLASSES, cls.name
    STRATEGY_CLASSES[cls.name] = cls
    return cls


def make_strategy(space: SearchSpace, spec: StudySpec, *, per_gpu_ranked: bool) -> Strategy:
    """The strategy the study file names (``sampler.strategy``, checked when the file loads)."""
    return STRATEGY_CLASSES[spec.sampler.strategy](space=space, spec=spec, per_gpu_ranked=per_gpu_ranked)
