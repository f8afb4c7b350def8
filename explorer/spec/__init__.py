"""The typed study file (``studies/*.yaml``): pydantic models and the safe YAML reader. A leaf:
:mod:`explorer.study_file` resolves a study against the space, the launchers and the table."""

from explorer.spec._load import LoadedStudy, read_yaml
from explorer.spec._models import (
    FAULT_KINDS,
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
    ResourcesSpec,
    SamplerSpec,
    StudySpec,
    SyntheticPreset,
    WorkloadSpec,
    parse_amount,
    parse_hours,
)

__all__ = [
    "BudgetSpec",
    "DatasetSpec",
    "FAULT_KINDS",
    "DurationSpec",
    "FaultKind",
    "FaultSpec",
    "LauncherSpec",
    "LoadedStudy",
    "MeasurementSpec",
    "MethodSpec",
    "ModelSpec",
    "ResourcesSpec",
    "SamplerSpec",
    "StudySpec",
    "SYNTHETIC_PRESETS",
    "SyntheticPreset",
    "WorkloadSpec",
    "parse_amount",
    "parse_hours",
    "read_yaml",
]
