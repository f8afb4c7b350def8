"""The launcher registry: each ``launcher.kind`` a study file may name, and the kind a study asks for.

A kind (:class:`~explorer.launch.LauncherKind`) answers every question whose answer depends on
it; the rest of explorer asks :func:`launcher_kind` and never compares kind names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from explorer.launch._contract import Launcher, LauncherKind
from explorer.launch._ray_kind import RayKind
from explorer.launch._replay_kind import ReplayKind

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy, ResourcesSpec, StudySpec

__all__ = ["LAUNCHERS", "launcher_for", "launcher_kind"]

LAUNCHERS: dict[str, LauncherKind] = {kind.name: kind for kind in (RayKind(), ReplayKind())}
"""Every launcher kind, by its ``launcher.kind`` name (the study file's sections are declared in
:data:`explorer.spec.LAUNCHER_CONFIGS`, the same names)."""


def launcher_kind(spec: StudySpec) -> LauncherKind:
    """The kind ``spec``'s launcher section names (the study file's model admits no other)."""
    return LAUNCHERS[spec.launcher.kind]


def launcher_for(
    loaded: LoadedStudy, *, output_dir: Path, resources: ResourcesSpec | None = None
) -> Launcher:
    """The launcher of ``loaded``'s ``launcher.kind`` (``resources`` overrides the study's)."""
    return launcher_kind(loaded.spec).build(loaded, output_dir=output_dir, resources=resources)
