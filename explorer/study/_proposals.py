"""The strategy's proposal (:mod:`explorer.search._strategy`), enqueued before the driver asks
the sampler: the loop tells the strategy what the study knows and records what it proposes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from explorer.record import Key, TrialRecord, enqueue
from explorer.search._strategy import Strategy, StudyState
from explorer.spec import LoadedStudy
from explorer.study._known import Known
from explorer.study._record import config_of, status_of
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

__all__ = ["propose"]


def propose(
    study: optuna.Study,
    loaded: LoadedStudy,
    strategy: Strategy,
    known: Known,
    busy: Iterable[TrialConfig],
    streak: int,
) -> None:
    """Enqueue the strategy's proposal, if it has one; nothing while an enqueued trial (grid,
    retry, resume, an earlier proposal) waits to go first."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state.name == "WAITING" for t in trials):
        return
    state = StudyState(
        asked=len(trials),
        answered=known.answered() | {c.key() for c in busy},
        feasible=known.feasible,
        ooms=known.ooms,
        peaks=known.peaks,
        streak=streak,
        params=lambda: [(k, v) for t in trials for k, v in t.params.items()],
        proposed=lambda by: [
            (config_of(t), status_of(t))
            for t in trials
            if (r := TrialRecord.of(t)).proposed_by == by and r.has("batch_size")
        ],
    )
    proposal = strategy.propose(state)
    if proposal is not None:
        enqueue(study, loaded.space.params_for(proposal.config), {Key.PROPOSED_BY: proposal.by})
