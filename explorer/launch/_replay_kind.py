"""The ``replay`` launcher kind: trials answered from a recorded table (``launcher.table``) on a
virtual clock (``launcher.durations``); nothing runs."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError
from explorer.launch._contract import Launcher, LauncherKind, launcher_section
from explorer.launch._replay import ReplayLauncher, ReplayTable
from explorer.paths import table_file
from explorer.spec import ReplayLauncherSpec

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy, ResourcesSpec, StudySpec

__all__ = ["ReplayKind", "replay_selection"]

FIELD = "launcher.table"


def _table(loaded: LoadedStudy) -> ReplayTable:
    """The table the loader read and checked (:meth:`ReplayKind.check`)."""
    if not isinstance(loaded.replay_table, ReplayTable):
        raise TypeError(f"{loaded.file}: a replay study loaded without its table")
    return loaded.replay_table


class ReplayKind(LauncherKind):
    """The recorded table's answer for each trial, holding its GPUs for the row's duration."""

    name = "replay"
    config = ReplayLauncherSpec
    summary = "answers each trial from a recorded table, on a virtual clock; nothing runs"

    def describe(self, loaded: LoadedStudy) -> str:
        table = loaded.replay_table
        return f"replay of {table.path}" if isinstance(table, ReplayTable) else "replay"

    def local(self, spec: StudySpec) -> bool:
        return False  # nothing runs here, nor anywhere

    def runs_nothing(self, spec: StudySpec) -> str | None:
        return "replay reads trials from a table: nothing runs on a node"

    def check(self, spec: StudySpec, *, label: str, base: Path, space: Any, probe: bool) -> ReplayTable:
        """The table, once it is readable, has rows for the study and a column for every
        parameter the search space varies."""
        from explorer.spec._load import resolve_path

        written = launcher_section(spec, ReplayLauncherSpec).table
        path = resolve_path(base, written)
        if not table_file(path).is_file():  # a large table may be kept as path.gz
            raise SpecError(file=label, field=FIELD, problem=f"{written} does not exist")
        try:
            table = ReplayTable.read(path, **replay_selection(spec))
        except SpecError as exc:  # name the study file and the field, as every other problem does
            where = path.name if exc.field == FIELD else f"{path.name} {exc.field}"
            raise SpecError(file=label, field=FIELD, problem=f"{where}: {exc.problem}") from None
        missing = table.missing_columns(itertools.islice(space.enumerate(), 200_000))
        if missing:
            raise SpecError(
                file=label,
                field=FIELD,
                problem=f"{path.name} has no column for the varied parameter(s) {', '.join(missing)}",
            )
        return table

    def gpu_model_refusal(self, spec: StudySpec, *, probe: bool) -> str | None:
        return "a replay study names the GPU model of its table's rows"

    def hardware_identity(self, loaded: LoadedStudy) -> dict[str, Any]:
        """The table file's bytes and the ``gpu_model`` that selects its rows: answers read from a
        table never stand in for real hardware, nor for another table, and a table edited in
        place is a new table."""
        resources = loaded.spec.resources
        models = {"gpu_models": dict(sorted(resources.gpu_models.items()))} if resources.gpu_models else {}
        digest = hashlib.sha256(_table(loaded).path.read_bytes()).hexdigest()
        section = launcher_section(loaded.spec, ReplayLauncherSpec)
        noise = {"noise": section.noise, "noise_seed": section.noise_seed} if section.noise else {}
        return {"table_sha256": digest, "gpu_model": resources.gpu_model, **models, **noise}

    def workload_identity(self, spec: StudySpec) -> dict[str, Any]:
        return {"runner": "torchrun"}  # what the key held when every study had a runner

    def build(self, loaded: LoadedStudy, *, output_dir: Path, resources: ResourcesSpec | None) -> Launcher:
        resources = resources or loaded.spec.resources
        section = launcher_section(loaded.spec, ReplayLauncherSpec)
        return ReplayLauncher(
            table=_table(loaded),
            total_gpus=resources.total_gpus,
            durations=section.durations,
            gpu_models=resources.gpu_models,
            noise=section.noise,
            noise_seed=section.noise_seed,
        )


def replay_selection(spec: StudySpec) -> dict[str, Any]:
    """The properties a study holds fixed, which select the rows of a replay table (``gpu_model``
    only with one GPU model; with ``resources.gpu_models`` each trial's is matched), and the GPU
    model a configuration without one runs on (``default_gpu_model``)."""
    workload = spec.workload
    return {
        "model_name": workload.model.name,
        "gpu_model": None if spec.resources.gpu_models else spec.resources.gpu_model,
        "method": workload.method.kind,
        "default_gpu_model": spec.resources.gpu_model,
    }
