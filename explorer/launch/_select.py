"""Which launcher a study file asks for, and the interface every launcher offers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from explorer.job import TrialJob
from explorer.measurement import Measurement

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy, ResourcesSpec, StudySpec

__all__ = ["Launcher", "launcher_for"]


class Launcher(Protocol):
    """Dispatches trial jobs and hands back their measurements (Ray actors, or a recorded table)."""

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def fits(self, number_gpus: int, number_nodes: int = 1, gpu_model: str | None = None) -> bool:
        """Whether a trial of ``number_gpus`` GPUs of ``gpu_model`` (``None``: of any of the
        study's models) on ``number_nodes`` nodes can start now."""
        ...

    def submit(self, job: TrialJob) -> None: ...

    def wait(self, timeout_s: float) -> list[tuple[int, Measurement]]: ...


def launcher_for(
    loaded: LoadedStudy, *, output_dir: Path, resources: ResourcesSpec | None = None
) -> Launcher:
    """The launcher of ``loaded``'s ``launcher.kind`` (``resources`` overrides the study's)."""
    spec = loaded.spec
    if spec.launcher.kind == "replay":
        from explorer.launch._replay import ReplayLauncher

        assert loaded.replay_table is not None  # the loader read and checked it
        return ReplayLauncher(
            table=loaded.replay_table,
            total_gpus=(resources or spec.resources).total_gpus,
            durations=spec.launcher.durations,
            gpu_models=(resources or spec.resources).gpu_models,
        )
    from explorer.launch._ray import RayLauncher

    return RayLauncher.for_study(spec, output_dir=output_dir, resources=resources)


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
