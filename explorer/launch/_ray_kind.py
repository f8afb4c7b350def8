"""The ``ray`` launcher kind: every trial runs, as Ray actors on a local Ray with logical GPUs
(no address) or on a Ray cluster (``launcher.address`` or ``RAY_ADDRESS``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError
from explorer.launch._contract import Launcher, LauncherKind, launcher_section
from explorer.launch._placement import accelerator_type
from explorer.spec import RayLauncherSpec

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy, ResourcesSpec, StudySpec

__all__ = ["RayKind"]


class RayKind(LauncherKind):
    """Ray actors, one per trial (a placement group across nodes), each starting the trial's ranks."""

    name = "ray"
    config = RayLauncherSpec
    summary = "runs every trial: Ray actors on a local Ray with logical GPUs, or on a Ray cluster"

    def describe(self, loaded: LoadedStudy) -> str:
        address = self.address(loaded.spec)
        return f"ray at {address}" if address else "ray (a local Ray started here)"

    def address(self, spec: StudySpec) -> str | None:
        """The cluster the trials run on: ``launcher.address``, else ``RAY_ADDRESS``; ``None``:
        a local Ray this process starts."""
        return launcher_section(spec, RayLauncherSpec).address or os.environ.get("RAY_ADDRESS") or None

    def local(self, spec: StudySpec) -> bool:
        return self.address(spec) is None

    def runs_nothing(self, spec: StudySpec) -> str | None:
        return None

    def check(self, spec: StudySpec, *, label: str, base: Path, space: Any, probe: bool) -> None:
        """On a cluster, no two declared GPU models share a Ray accelerator type (Ray could not
        tell their nodes apart); ``probe``: Ray answers at the address."""
        from explorer.spec._ray_address import check_ray_address

        config = launcher_section(spec, RayLauncherSpec)
        if config.address and spec.resources.gpu_models:
            _distinct_accelerator_types(list(spec.resources.models), label)
        if probe:
            check_ray_address(config.address, file=label)

    def gpu_model_refusal(self, spec: StudySpec, *, probe: bool) -> str | None:
        if not probe or self.local(spec):
            return None
        return (
            "required on a Ray cluster: name the GPU model of its nodes (e.g. NVIDIA-H100-80GB-HBM3); "
            "it cannot be read from this machine"
        )

    def hardware_identity(self, loaded: LoadedStudy) -> None:
        return None  # the study file's resources section

    def workload_identity(self, spec: StudySpec) -> dict[str, Any]:
        return {
            "runner": launcher_section(spec, RayLauncherSpec).runner
        }  # torchrun or accelerate start the ranks differently

    def build(self, loaded: LoadedStudy, *, output_dir: Path, resources: ResourcesSpec | None) -> Launcher:
        from explorer.launch._ray import RayLauncher

        return RayLauncher.for_study(loaded.spec, output_dir=output_dir, resources=resources)


def _distinct_accelerator_types(models: list[str], label: str) -> None:
    """Refuse two GPU models that Ray names with the same accelerator type."""
    seen: dict[str, str] = {}
    for name in models:
        other = seen.setdefault(accelerator_type(name), name)
        if other != name:
            raise SpecError(
                file=label,
                field="resources.gpu_models",
                problem=f"{other} and {name} are both Ray accelerator type {accelerator_type(name)!r}: "
                "on a cluster Ray cannot tell their nodes apart",
            )
