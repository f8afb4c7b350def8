"""The typed study file (``studies/*.yaml``) and its loader."""

from explorer.spec._load import LoadedStudy, load_study, read_yaml
from explorer.spec._models import (
    FAULT_KINDS,
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
    WorkloadSpec,
)

__all__ = [
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
    "WorkloadSpec",
    "load_study",
    "read_yaml",
]
