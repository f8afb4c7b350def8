"""The typed study file (``studies/*.yaml``) and its loader."""

from explorer.spec._load import LoadedStudy, load_study, read_yaml
from explorer.spec._models import (
    DatasetSpec,
    DurationSpec,
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
    "DurationSpec",
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
