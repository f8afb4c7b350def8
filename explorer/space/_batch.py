"""One storage round trip where Optuna's ``suggest_*`` calls make one each.

Asking a trial for its parameters costs, through Optuna's API, a commit per parameter
(``Trial._suggest`` writes each with ``set_trial_param``) and, with TPE's constant liar, a read of
every trial per parameter group (``TPESampler._sample`` reads the study's trials afresh each
time). Within one :meth:`~explorer.space.SearchSpace.suggest` neither is needed: the parameters
can go in one transaction at the end, and nothing the sampler reads changes (the only trial it
writes is the one being asked, which it leaves out). :func:`asking` does that; the sampler draws
the same values in the same order, so every search's trial sequence is unchanged.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Container, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

__all__ = ["asking"]


class _Asking:
    """A stand-in for the study's storage while one trial is asked for its parameters: the
    parameters are held back (:meth:`flush` writes them), the study's trials are read once, and
    every other call goes to the storage itself."""

    def __init__(self, storage: optuna.storages.BaseStorage) -> None:
        self._storage = storage
        self._params: list[tuple[int, str, float, optuna.distributions.BaseDistribution]] = []
        self._system: list[tuple[int, str, Any]] = []
        self._trials: list[optuna.trial.FrozenTrial] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: optuna.distributions.BaseDistribution,
    ) -> None:
        self._params.append((trial_id, param_name, param_value_internal, distribution))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._system.append((trial_id, key, value))  # TPE's relative parameters (constant liar)

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[Any] | None = None
    ) -> list[optuna.trial.FrozenTrial]:
        if self._trials is None:
            self._trials = self._storage.get_all_trials(study_id, deepcopy=False)
        trials = self._trials if states is None else [t for t in self._trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else list(trials)

    def flush(self) -> None:
        """Write the held-back parameters and system attrs: in one transaction on an RDB storage
        (:func:`_write`; Optuna's private session helpers, checked for), else one call each."""
        params, self._params = self._params, []
        system, self._system = self._system, []
        if not (params or system):
            return
        from optuna.storages import RDBStorage

        backend = getattr(self._storage, "_backend", self._storage)  # _CachedStorage wraps RDB
        if not (isinstance(backend, RDBStorage) and hasattr(backend, "_set_trial_attr_without_commit")):
            for attr in system:
                self._storage.set_trial_system_attr(*attr)
            for param in params:
                self._storage.set_trial_param(*param)
            return
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(backend.scoped_session) as session:
            _write(session, backend, self._storage, params, system)


def _write(session: Any, backend: Any, storage: Any, params: list[Any], system: list[Any]) -> None:
    """The held-back writes of one trial in ``session``: one check that it is still running,
    each new parameter's distribution checked against the study's (as Optuna does), one insert
    of every parameter, one upsert per system attr."""
    import sqlalchemy
    from optuna.distributions import check_distribution_compatibility, distribution_to_json
    from optuna.storages._rdb import models

    trial_id = (params or system)[0][0]
    row = models.TrialModel.find_or_raise_by_id(trial_id, session)
    backend.check_trial_is_updatable(trial_id, row.state)
    known = _known_distributions(storage, trial_id)
    for _, name, _, distribution in params:
        previous = known.get(name) or _stored_distribution(session, int(row.study_id), name)
        if previous is not None:
            check_distribution_compatibility(previous, distribution)
        known.setdefault(name, distribution)
    if params:
        session.execute(
            sqlalchemy.insert(models.TrialParamModel),
            [
                {
                    "trial_id": trial_id,
                    "param_name": name,
                    "param_value": value,
                    "distribution_json": distribution_to_json(distribution),
                }
                for trial_id, name, value, distribution in params
            ],
        )
    for trial_id, key, value in system:
        backend._set_trial_attr_without_commit(
            session, models.TrialSystemAttributeModel, trial_id, key, value
        )


def _stored_distribution(session: Any, study_id: int, name: str) -> Any:
    """The distribution of parameter ``name`` in any stored trial of the study (``None``: none)."""
    from optuna.distributions import json_to_distribution
    from optuna.storages._rdb import models

    first = (
        session.query(models.TrialParamModel)
        .join(models.TrialModel)
        .filter(models.TrialModel.study_id == study_id)
        .filter(models.TrialParamModel.param_name == name)
        .first()
    )
    return None if first is None else json_to_distribution(first.distribution_json)


def _known_distributions(storage: Any, trial_id: int) -> dict[str, Any]:
    """The distribution of each parameter the study has seen, where ``storage`` is Optuna's
    ``_CachedStorage`` (as its ``set_trial_param`` checks a new one against them), else an empty
    dict: the RDB storage then reads the one stored before."""
    try:
        study_id, _ = storage._trial_id_to_study_id_and_number[trial_id]
        known: dict[str, Any] = storage._studies[study_id].param_distribution
    except (AttributeError, KeyError):
        return {}
    return known


@contextlib.contextmanager
def asking(trial: optuna.Trial) -> Iterator[None]:
    """While ``trial`` is asked for its parameters: hold their writes back and read the study's
    trials once; on leaving without an error, write the parameters in one transaction."""
    study = trial.study
    storage = study._storage
    batch = _Asking(storage)
    trial.storage = study._storage = batch  # type: ignore[assignment]
    try:
        yield
    finally:
        trial.storage = study._storage = storage
    batch.flush()
