"""Proposals the driver enqueues before asking the sampler: local search's (the frontier walk or
a covering start, then neighbours of the best configurations) and, with
``when_converged: explore``, an unanswered configuration at random."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from explorer.record import Key, TrialRecord, enqueue
from explorer.search._frontier import frontier_stopped
from explorer.search._inference import inferred_oom
from explorer.search._neighbours import LocalSearch
from explorer.search._sampler import DEFAULT_STARTUP
from explorer.spec import LoadedStudy
from explorer.study._known import Known
from explorer.study._record import config_of, status_of
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

if TYPE_CHECKING:
    import optuna

__all__ = ["propose_neighbour", "propose_unanswered"]


def propose_neighbour(
    study: optuna.Study,
    loaded: LoadedStudy,
    local: LocalSearch,
    known: Known,
    busy: Iterable[TrialConfig],
) -> None:
    """Enqueue local search's proposal, when it is its turn: a start-up configuration (the
    frontier walk's probe, or one that covers the space), then an unanswered neighbour of the best
    configurations; nothing (the sampler's turn) when none is left, or every ``global_every``-th
    trial if set."""
    sampler = loaded.spec.sampler
    startup = DEFAULT_STARTUP if sampler.n_startup_trials is None else sampler.n_startup_trials
    trials = study.get_trials(deepcopy=False)
    if any(t.state.name == "WAITING" for t in trials):
        return  # an enqueued trial (grid, retry, resume, an earlier proposal) goes first
    answered = known.answered() | {c.key() for c in busy}
    # the walk probes only within the start-up trials, so at most `startup` probes exist and the
    # start ends by 2 * startup: past that, no need to read the probes back on every ask
    probes = [
        (config_of(t), status_of(t))
        for t in (trials if len(trials) < 2 * startup else ())
        if (r := TrialRecord.of(t)).proposed_by == "frontier" and r.has("batch_size")
    ]
    walking = local.frontier and not frontier_stopped(probes)
    if local.modelled:
        _propose_modelled(
            study,
            loaded,
            local,
            known,
            answered,
            walk=walking and len(trials) < startup,
            last=probes[-1][0] if probes else None,
        )
        return
    if len(trials) < startup + (0 if walking else len(probes)):
        seen = [(k, v) for t in trials for k, v in t.params.items()]
        seed = f"{sampler.seed}:{len(trials)}"
        probe = None
        if walking:
            probe = local.probe(
                seen=seen,
                seed=seed,
                answered=answered,
                ooms=known.ooms,
                fitted=[c for c, _, _ in known.feasible.values()],
                last=probes[-1][0] if probes else None,
            )
        if probe is not None:
            enqueue(study, loaded.space.params_for(probe), {Key.PROPOSED_BY: "frontier"})
        else:
            start = local.start(seen=seen, seed=seed)
            enqueue(study, loaded.space.params_for(start), {Key.PROPOSED_BY: "start"})
        return
    if not known.feasible or (sampler.global_every and len(trials) % sampler.global_every == 0):
        return
    feasible = [(c, v) for c, v, _ in known.feasible.values()]
    proposal = local.propose(
        feasible=feasible, answered=answered, ooms=known.ooms, peaks=known.peaks.values()
    )
    if proposal is None:
        return
    config, base = proposal
    enqueue(
        study,
        loaded.space.params_for(config),
        {Key.PROPOSED_BY: f"neighbour of trial {known.feasible[base.key()][2]}"},
    )


def _propose_modelled(
    study: optuna.Study,
    loaded: LoadedStudy,
    local: LocalSearch,
    known: Known,
    answered: set[str],
    *,
    walk: bool,
    last: TrialConfig | None,
) -> None:
    """The joint models' proposal (:mod:`explorer.search._surrogate`), after the frontier walk's
    probes while it walks (``walk``); the sampler's turn every ``global_every``-th trial if set."""
    asked = study.get_trials(deepcopy=False)
    trials = len(asked)
    fitted = [c for c, _, _ in known.feasible.values()]
    if walk:
        probe = local.probe(
            seen=[(k, v) for t in asked for k, v in t.params.items()],
            seed=f"{loaded.spec.sampler.seed}:{trials}",
            answered=answered,
            ooms=known.ooms,
            fitted=fitted,
            last=last,
        )
        if probe is not None:
            enqueue(study, loaded.space.params_for(probe), {Key.PROPOSED_BY: "frontier"})
            return
    every = loaded.spec.sampler.global_every
    if every and trials % every == 0:
        return
    config = local.modelled_next(
        feasible=[(c, v) for c, v, _ in known.feasible.values()],
        answered=answered,
        ooms=known.ooms,
        peaks=known.peaks.values(),
        fitted=fitted,
        salt=f"{loaded.spec.sampler.seed}:{trials}",
    )
    if config is not None:
        enqueue(study, loaded.space.params_for(config), {Key.PROPOSED_BY: "model"})


def propose_unanswered(
    study: optuna.Study,
    loaded: LoadedStudy,
    known: Known,
    busy: Iterable[TrialConfig],
    configs: list[TrialConfig],
) -> None:
    """Enqueue a random configuration of the space that is not answered, in flight, invalid or
    inferred OOM (``when_converged: explore``); none left: nothing (the streak then stops the study)."""
    import random

    from optuna.trial import TrialState

    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return
    taken = known.answered() | {c.key() for c in busy}
    if not configs:  # the valid configurations of the space, enumerated once
        configs.extend(
            c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None
        )
    rng = random.Random(f"{loaded.spec.sampler.seed}:{len(study.get_trials(deepcopy=False))}")
    for i in rng.sample(range(len(configs)), len(configs)):
        c = configs[i]
        if c.key() not in taken and inferred_oom(c, known.ooms) is None:
            enqueue(study, loaded.space.params_for(c), {Key.PROPOSED_BY: "explore"})
            return
