"""A typed, read-only view of a trial's (and a study's) record: Optuna's user_attrs, read by name.

A key a trial never got (a study recorded before the key existed, a trial asked but not yet
tagged) reads as its default, mostly ``None``; nothing here writes.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from explorer.record._keys import COUNTED, Key, StudyKey

if TYPE_CHECKING:
    import optuna

__all__ = [
    "StudyRecord",
    "TrialRecord",
    "answered_without_running",
    "copy_trial",
    "counts",
    "infeasibility",
    "status_of",
]


class _Recorded(Protocol):
    """A trial, frozen (``optuna.trial.FrozenTrial``) or running (``optuna.Trial``)."""

    @property
    def number(self) -> int: ...

    @property
    def user_attrs(self) -> dict[str, Any]: ...


def _number(value: object) -> float | None:
    """``value`` as a float where it is a stored number (not a bool), else ``None``."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return str(value) if value is not None else None


@dataclass(frozen=True)
class TrialRecord:
    """One trial's record as stored: :meth:`of` a trial, then its typed properties."""

    number: int
    attrs: Mapping[str, Any]
    """Every stored key, read-only."""

    @classmethod
    def of(cls, trial: _Recorded) -> TrialRecord:
        return cls(number=trial.number, attrs=types.MappingProxyType(trial.user_attrs))

    def get(self, key: str, default: Any = None) -> Any:
        """The stored value of ``key`` as it is (a configuration field, a measured property)."""
        return self.attrs.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.attrs

    def __getitem__(self, key: str) -> Any:
        return self.attrs[key]

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(self.attrs.items())

    def fields(self, names: Iterable[str]) -> dict[str, Any]:
        """The stored values of those of ``names`` the trial has (its configuration's fields)."""
        return {n: self.attrs[n] for n in names if n in self.attrs}

    @property
    def status(self) -> str | None:
        """:class:`~explorer.record.Status`'s value, or ``None`` (running, or never recorded)."""
        return _str(self.attrs.get(Key.STATUS))

    @property
    def error(self) -> str | None:
        return _str(self.attrs.get(Key.ERROR))

    @property
    def attempt(self) -> int:
        return int(self.attrs.get(Key.ATTEMPT, 0))

    @property
    def driver(self) -> dict[str, Any] | None:
        driver = self.attrs.get(Key.DRIVER)
        return driver if isinstance(driver, dict) else None

    @property
    def config_key(self) -> str | None:
        return _str(self.attrs.get(Key.CONFIG_KEY))

    @property
    def proposed_by(self) -> str | None:
        return _str(self.attrs.get(Key.PROPOSED_BY))

    @property
    def reused_from(self) -> int | None:
        return _int(self.attrs.get(Key.REUSED_FROM))

    @property
    def reused_from_store(self) -> dict[str, Any] | None:
        source = self.attrs.get(Key.REUSED_FROM_STORE)
        return source if isinstance(source, dict) else None

    @property
    def inferred_from(self) -> int | None:
        return _int(self.attrs.get(Key.INFERRED_FROM))

    @property
    def requeued_from(self) -> int | None:
        return _int(self.attrs.get(Key.REQUEUED_FROM))

    @property
    def recovered(self) -> str | None:
        return _str(self.attrs.get(Key.RECOVERED))

    @property
    def injected_fault(self) -> str | None:
        return _str(self.attrs.get(Key.INJECTED_FAULT))

    @property
    def waits_for(self) -> int | None:
        return _int(self.attrs.get(Key.WAITS_FOR))

    @property
    def log_file(self) -> str | None:
        return _str(self.attrs.get(Key.LOG_FILE))

    @property
    def wall_seconds(self) -> float | None:
        return _number(self.attrs.get(Key.WALL_SECONDS))

    @property
    def per_gpu(self) -> float | None:
        """``dataset_tokens_per_second_per_gpu`` as measured (feasible trials)."""
        return _number(self.attrs.get(Key.PER_GPU))

    @property
    def total(self) -> float | None:
        """``dataset_tokens_per_second``, all GPUs together."""
        return _number(self.attrs.get(Key.TOTAL))

    @property
    def peak_memory_gib(self) -> float | None:
        return _number(self.attrs.get(Key.PEAK_MEMORY_GIB))

    @property
    def memory_limit_gib(self) -> float | None:
        return _number(self.attrs.get(Key.MEMORY_LIMIT_GIB))

    @property
    def mfu(self) -> float | None:
        return _number(self.attrs.get(Key.MFU))

    @property
    def step_time_mean(self) -> float | None:
        return _number(self.attrs.get(Key.STEP_TIME_MEAN))

    @property
    def step_time_rel_ci(self) -> float | None:
        return _number(self.attrs.get(Key.STEP_TIME_REL_CI))

    @property
    def device(self) -> str | None:
        return _str(self.attrs.get(Key.DEVICE))

    @property
    def number_gpus(self) -> int:
        return int(self.attrs.get(Key.NUMBER_GPUS, 1))

    @property
    def gpu_model(self) -> str | None:
        """The trial's GPU model, where the study searches it."""
        model = self.attrs.get(Key.GPU_MODEL)
        return model if isinstance(model, str) else None

    @property
    def nodes(self) -> list[Any] | None:
        nodes = self.attrs.get(Key.NODES)
        return nodes if isinstance(nodes, list) else None

    @property
    def ranks(self) -> list[Any] | None:
        ranks = self.attrs.get(Key.RANKS)
        return ranks if isinstance(ranks, list) else None

    @property
    def answered_without_running(self) -> bool:
        """Reused within the study or inferred: a free answer, which does not count.

        An answer from the measurement store is not one of these: it counts, as the study's first
        answer for its configuration.
        """
        return Key.REUSED_FROM in self.attrs or Key.INFERRED_FROM in self.attrs

    @property
    def counts(self) -> bool:
        """Whether it counts towards ``n_trials``: finished for good, and not a free answer."""
        return self.status in COUNTED and not self.answered_without_running


@dataclass(frozen=True)
class StudyRecord:
    """A study's record as stored: :meth:`of` a study (one storage read), then its properties."""

    attrs: Mapping[str, Any]

    @classmethod
    def of(cls, study: optuna.Study) -> StudyRecord:
        return cls(attrs=types.MappingProxyType(study.user_attrs))

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.attrs

    @property
    def identity(self) -> dict[str, Any] | None:
        identity = self.attrs.get(StudyKey.IDENTITY)
        return identity if isinstance(identity, dict) else None

    @property
    def run_folder(self) -> str | None:
        folder = self.attrs.get(StudyKey.RUN_FOLDER)
        return folder if isinstance(folder, str) else None

    @property
    def n_trials(self) -> int | None:
        n = self.attrs.get(StudyKey.N_TRIALS)
        return n if isinstance(n, int) else None

    @property
    def stopped_early(self) -> dict[str, Any] | None:
        stopped = self.attrs.get(StudyKey.STOPPED_EARLY)
        return stopped if isinstance(stopped, dict) else None

    @property
    def settings(self) -> dict[str, Any]:
        """The objectives' settings (``{}``: none recorded)."""
        settings = self.attrs.get(StudyKey.SETTINGS)
        return settings if isinstance(settings, dict) else {}

    @property
    def doctor(self) -> dict[str, Any] | None:
        doctor = self.attrs.get(StudyKey.DOCTOR)
        return doctor if isinstance(doctor, dict) else None

    def measured_node(self, gpu_model: str) -> dict[str, Any] | None:
        """The figures ``explorer doctor`` measured on a node of ``gpu_model`` (matmul TFLOP/s,
        allocatable memory, bus bandwidths: :func:`explorer.doctor._node.measure_node`), recorded
        under the doctor's key; ``None``: never measured there."""
        node = ((self.doctor or {}).get("nodes") or {}).get(gpu_model)
        measured = node.get("measured") if isinstance(node, dict) else None
        return measured if isinstance(measured, dict) else None

    @property
    def confirmation(self) -> dict[str, Any] | None:
        """The last confirmation of the best (``None``: never confirmed)."""
        confirmation = self.attrs.get(StudyKey.CONFIRMATION)
        return confirmation if isinstance(confirmation, dict) else None


def status_of(trial: _Recorded) -> str | None:
    return TrialRecord.of(trial).status


def answered_without_running(trial: _Recorded) -> bool:
    """:attr:`TrialRecord.answered_without_running` of ``trial``."""
    return TrialRecord.of(trial).answered_without_running


def counts(trial: _Recorded) -> bool:
    """:attr:`TrialRecord.counts` of ``trial``."""
    return TrialRecord.of(trial).counts


def infeasibility(trial: optuna.trial.FrozenTrial) -> float:
    """The largest constraint value of ``trial`` (> 0: infeasible; 0 where none is set), in
    either form: the list :data:`~explorer.record.CONSTRAINTS_KEY` (written since the dashboard
    showed oom trials as real results) or ``constraints:infeasible`` (studies recorded before)."""
    return max(trial.constraints.values(), default=0.0)


def copy_trial(
    trial: optuna.trial.FrozenTrial,
    *,
    state: optuna.trial.TrialState,
    values: list[float] | None,
    params: dict[str, Any],
    distributions: dict[str, Any],
) -> optuna.trial.FrozenTrial:
    """A copy of ``trial`` that holds the same record (and system attrs, times, intermediate
    values and id) with these fields changed: a trial as a view of the study shows it."""
    from optuna.trial import FrozenTrial

    return FrozenTrial(
        number=trial.number,
        state=state,
        value=None,
        values=values,
        datetime_start=trial.datetime_start,
        datetime_complete=trial.datetime_complete,
        params=params,
        distributions=distributions,
        user_attrs=trial.user_attrs,
        system_attrs=trial.system_attrs,
        intermediate_values=trial.intermediate_values,
        trial_id=trial._trial_id,
    )
