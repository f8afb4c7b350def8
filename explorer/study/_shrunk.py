"""Stored trials outside the study file's search space: a space shrunk after trials ran.

Optuna accepts the new space silently, and the trials it can no longer propose would still rank
(``best``, ``report``) beside those it can. ``optimize`` refuses such a study instead, naming the
trials and values, before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from explorer.errors import SpecError
from explorer.record import TrialRecord
from explorer.spec import LoadedStudy
from explorer.study._record import config_of

if TYPE_CHECKING:
    import optuna

    from explorer.space import SearchSpace
    from explorer.space._domain import Value
    from explorer.trial_config import TrialConfig

__all__ = ["check_space_holds_trials", "outside_values"]


def outside_values(space: SearchSpace, config: TrialConfig) -> list[str]:
    """The values of ``config`` that ``space`` cannot propose (``name=value``); ``[]``: inside."""
    values = config.to_dict()
    bad: list[str] = []
    held = _held_by_workload(space)

    def pick(name: str) -> Value:
        if name in held:  # the job's own value: a change there is the identity's to refuse
            return space.domains[name].values[0]
        value: Value = space.asked_value(name, values)
        if value not in space.domains[name].values:
            bad.append(f"{name}={value}")
        return value

    rebuilt = space._build(pick).to_dict()  # the configuration the space makes of these choices
    if bad:
        return bad
    return [
        f"{name}={value}" for name, value in values.items() if name not in held and rebuilt.get(name) != value
    ]


def _held_by_workload(space: SearchSpace) -> set[str]:
    """The knobs the search space does not search that take their value from the workload
    (``model_max_length``...): part of the study's identity (:mod:`explorer.study._identity`)."""
    from explorer.knobs import knob
    from explorer.space._domain import Fixed

    return {
        name
        for name, domain in space.domains.items()
        if isinstance(domain, Fixed) and knob(name).default_from is not None
    }


def check_space_holds_trials(study: optuna.Study, loaded: LoadedStudy) -> None:
    """Refuse a study whose counted trials lie outside ``loaded``'s search space.

    Raises:
        SpecError: naming the first few such trials and their values.
    """
    found = []
    for t in study.get_trials(deepcopy=False):
        record = TrialRecord.of(t)
        if record.counts and record.config_key is not None:
            bad = outside_values(loaded.space, config_of(t))
            if bad:
                found.append(f"trial {t.number}: {', '.join(bad)}")
    if found:
        shown = "; ".join(found[:3]) + ("; ..." if len(found) > 3 else "")
        raise SpecError(
            file=str(loaded.file),
            field="search_space",
            problem=f"{len(found)} stored trial(s) of study {loaded.spec.name!r} lie outside this search "
            f"space ({shown}): they would rank beside what it can propose; put those values back, "
            "or give the study a new name",
        )
