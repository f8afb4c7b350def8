"""The contract every launcher kind meets: the running launcher's interface, and the questions a
kind answers about a study (is it local, what to check at load time, what names its hardware)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from explorer.job import TrialJob
from explorer.measurement import Measurement

if TYPE_CHECKING:
    from pydantic import BaseModel

    from explorer.spec import LoadedStudy, ResourcesSpec, StudySpec

__all__ = ["Launcher", "LauncherKind", "launcher_section"]

Section = TypeVar("Section")


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


class LauncherKind(ABC):
    """One ``launcher.kind`` of a study file: its section's model, and everything the rest of
    explorer asks about a study that depends on the kind. Callers ask the kind
    (:func:`explorer.launch.launcher_kind`); none compares kind names."""

    name: ClassVar[str]
    """The study file's ``launcher.kind``."""
    config: ClassVar[type[BaseModel]]
    """The model of its ``launcher`` section (declared in :mod:`explorer.spec`)."""
    summary: ClassVar[str]
    """One line: what this kind does with a trial."""

    @abstractmethod
    def describe(self, loaded: LoadedStudy) -> str:
        """One line: where this study's trials are answered (the study's ``launcher`` attr)."""

    @abstractmethod
    def local(self, spec: StudySpec) -> bool:
        """Whether the trials run on this machine, on a cluster this process starts."""

    @abstractmethod
    def runs_nothing(self, spec: StudySpec) -> str | None:
        """Why no trial process runs on a node (``None``: they do), for the commands that need one."""

    @abstractmethod
    def check(self, spec: StudySpec, *, label: str, base: Path, space: Any, probe: bool) -> Any:
        """Check the launcher's part of a loaded study file, ``probe``: reach what it points to
        (a cluster) too. Returns what the launcher reads (the replay table), else ``None``.

        Raises:
            SpecError: one line naming ``label`` and the field.
        """

    @abstractmethod
    def gpu_model_refusal(self, spec: StudySpec, *, probe: bool) -> str | None:
        """Why ``resources.gpu_model`` must be declared for a CUDA study (``None``: it may be
        read, from this machine's GPU when ``probe``, else from the stored study)."""

    @abstractmethod
    def hardware_identity(self, loaded: LoadedStudy) -> dict[str, Any] | None:
        """What the answers' hardware is, where it is not the study's ``resources`` (``None``):
        a store key of ``<name>:`` and its digest."""

    @abstractmethod
    def workload_identity(self, spec: StudySpec) -> dict[str, Any]:
        """What of the launcher's section changes a measurement (part of the workload key)."""

    @abstractmethod
    def build(self, loaded: LoadedStudy, *, output_dir: Path, resources: ResourcesSpec | None) -> Launcher:
        """The launcher that runs ``loaded``'s trials (``resources`` overrides the study's)."""


def launcher_section(spec: StudySpec, model: type[Section]) -> Section:
    """``spec``'s launcher section, typed as ``model``: for code that only one kind's study
    reaches (the doctor's Ray settings, a replay's durations).

    Raises:
        TypeError: the study's launcher is of another kind.
    """
    if not isinstance(spec.launcher, model):
        raise TypeError(f"the study's launcher is {spec.launcher.kind}, not a {model.__name__}")
    return spec.launcher
