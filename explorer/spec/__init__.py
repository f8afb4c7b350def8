"""The typed study file (``studies/*.yaml``): pydantic models and the safe YAML reader. A leaf:
:mod:`explorer.study_file` resolves a study against the space, the launchers and the table."""

from explorer.spec._load import LoadedStudy, read_yaml
from explorer.spec._models import (
    FAULT_KINDS,
    LAUNCHER_CONFIGS,
    SYNTHETIC_PRESETS,
    BudgetSpec,
    DatasetSpec,
    DurationSpec,
    FaultKind,
    FaultSpec,
    LauncherSpec,
    MeasurementSpec,
    MethodSpec,
    ModelSpec,
    RayLauncherSpec,
    ReplayLauncherSpec,
    ResourcesSpec,
    SamplerSpec,
    StudySpec,
    SyntheticPreset,
    WorkloadSpec,
    parse_amount,
    parse_hours,
)
from explorer.spec._objectives import OBJECTIVE_TABLE, Objective
from explorer.spec._reference import study_file_page

__all__ = [
    "BudgetSpec",
    "DatasetSpec",
    "FAULT_KINDS",
    "LAUNCHER_CONFIGS",
    "DurationSpec",
    "FaultKind",
    "FaultSpec",
    "LauncherSpec",
    "LoadedStudy",
    "MeasurementSpec",
    "MethodSpec",
    "ModelSpec",
    "RayLauncherSpec",
    "ReplayLauncherSpec",
    "ResourcesSpec",
    "SamplerSpec",
    "StudySpec",
    "SYNTHETIC_PRESETS",
    "SyntheticPreset",
    "WorkloadSpec",
    "parse_amount",
    "parse_hours",
    "read_yaml",
    "study_file_page",
    "Objective",
    "OBJECTIVE_TABLE",
]
