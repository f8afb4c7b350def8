"""Open a study in its storage (created, or required to exist), and enqueue a grid."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

from explorer.record import StudyRecord, TrialRecord, write_study
from explorer.search._sampler import make_sampler
from explorer.secrets import mask_url
from explorer.spec import LoadedStudy
from explorer.study._identity import check_identity, check_same_job
from explorer.study._objectives import (
    OBJECTIVES,
    SECOND_OBJECTIVES,
    SETTINGS_ATTR,
    Direction,
    objective_settings,
)
from explorer.study._record import OBJECTIVE
from explorer.study._storage import has_schema, load_readonly, open_storage, writable_file
from explorer.validity import invalid_reason

if TYPE_CHECKING:
    import optuna

__all__ = ["enqueue_grid", "open_existing_study", "open_study"]


def open_study(
    loaded: LoadedStudy,
    *,
    create: bool,
    sampler: optuna.samplers.BaseSampler | None = None,
    storage: optuna.storages.BaseStorage | None = None,
) -> optuna.Study:
    """The study in its storage; ``create`` makes it if missing (else it must exist).

    Args:
        sampler: instead of the study file's (``benchmark-search`` compares samplers this way).
        storage: instead of the study's URL (``benchmark-search`` replays in memory).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage or open_storage(loaded.storage_url, field_file=str(loaded.file) + ": storage")
    sampler = sampler or make_sampler(loaded.spec.sampler)
    if create:
        spec = loaded.spec
        names: list[str] = [spec.objective] + ([second] if (second := spec.second_objective) else [])
        directions: list[Direction] = [OBJECTIVES[spec.objective]]
        if second:
            directions.append(SECOND_OBJECTIVES[second])
        study = optuna.create_study(
            study_name=loaded.spec.name,
            storage=storage,
            sampler=sampler,
            directions=directions,
            load_if_exists=True,
        )
        # a study stored before metric names were written was searched on the per-GPU rate
        stored = study.metric_names or ([OBJECTIVE] * len(directions) if study.trials else names)
        if [d.name.lower() for d in study.directions] != directions or stored[:1] != names[:1]:
            from explorer.errors import SpecError

            raise SpecError(
                file=str(loaded.file),
                field="objective" if stored[:1] != names[:1] else "second_objective",
                problem=f"the stored study {loaded.spec.name!r} has other objectives ({', '.join(stored)}); "
                "use a new name",
            )
        check_identity(study, loaded)  # the same job as when it was created, or one line
        if study.metric_names is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(names)
        if not StudyRecord.of(study).has(SETTINGS_ATTR):
            budget = spec.budget
            write_study(
                study,
                SETTINGS_ATTR,
                objective_settings(
                    prices=dict(spec.prices),
                    gpu_model=spec.resources.model,
                    total_tokens=budget.total_tokens if budget else None,
                ),
            )
        return study
    return optuna.load_study(study_name=loaded.spec.name, storage=storage, sampler=sampler)


def open_existing_study(loaded: LoadedStudy) -> optuna.Study:
    """The study, which must exist; a missing sqlite file is not created.

    Raises:
        SpecError: no such study (or database file).
    """
    from pathlib import Path

    from sqlalchemy.engine import make_url

    from explorer.errors import SpecError

    missing = SpecError(
        file=str(loaded.file),
        field="name",
        problem=f"no study {loaded.spec.name!r} in {mask_url(loaded.storage_url)}",
    )
    url = make_url(loaded.storage_url)
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and database not in ("", ":memory:"):
        if not Path(database).is_file():
            raise missing
        if not writable_file(Path(database)) or not has_schema(Path(database)):
            study = load_readonly(loaded)  # a read-only file, or none of Optuna's tables: none written
            check_same_job(study, loaded)
            return study
    try:
        study = open_study(loaded, create=False)
    except KeyError:  # optuna: "Record does not exist."
        raise missing from None
    check_same_job(study, loaded)
    return study


def enqueue_grid(study: optuna.Study, loaded: LoadedStudy) -> int:
    """For ``sampler: grid``: enqueue every valid configuration not yet in the study.

    The study's trials are read once: a configuration is in it when a trial recorded its key or
    holds its parameters (asked, or enqueued and still waiting). Optuna's own check
    (``enqueue_trial(skip_if_exists=True)``) reads every trial again for each enqueue: 5.8-6.2 s
    for a 196-configuration grid against 0.8-0.9 s this way, and it grows with the grid's square."""
    trials = study.get_trials(deepcopy=False)
    seen = {TrialRecord.of(t).config_key for t in trials}
    held = {_params_key(t.system_attrs.get("fixed_params", t.params)) for t in trials}
    n = 0
    for config in loaded.space.enumerate():
        if config.key() in seen or invalid_reason(config, loaded.spec.resources):
            continue
        params = loaded.space.params_for(config)
        if _params_key(params) in held:
            continue
        study.enqueue_trial(params)
        held.add(_params_key(params))
        n += 1
    return n


def _params_key(params: Mapping[str, object]) -> frozenset[tuple[str, object]]:
    """A trial's parameters as a set, for comparing two trials' in one lookup."""
    return frozenset(params.items())
