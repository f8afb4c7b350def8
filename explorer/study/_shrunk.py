"""Stored trials outside the study file's search space: a space shrunk after trials ran.

Optuna accepts the new space silently, and the trials it can no longer propose would still rank
(``best``, ``report``) beside those it can. ``optimize`` refuses such a study instead, naming the
trials and values, before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from explorer.errors import SpecError
from explorer.spec import LoadedStudy
from explorer.study._record import config_of, counts

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

    def pick(name: str) -> Value:
        value: Value = values[name]
        if value not in space.domains[name].values:
            bad.append(f"{name}={value}")
        return value

    rebuilt = space._build(pick).to_dict()  # the configuration the space makes of these choices
    if bad:
        return bad
    return [f"{name}={value}" for name, value in values.items() if rebuilt.get(name) != value]


def check_space_holds_trials(study: optuna.Study, loaded: LoadedStudy) -> None:
    """Refuse a study whose counted trials lie outside ``loaded``'s search space.

    Raises:
        SpecError: naming the first few such trials and their values.
    """
    found = []
    for t in study.get_trials(deepcopy=False):
        if counts(t) and "config_key" in t.user_attrs:
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
