"""A trial job: everything the worker processes need, serialisable to one JSON string."""

from __future__ import annotations

import json
from dataclasses import dataclass

from explorer.fault import InjectedFault
from explorer.spec import LoadedStudy, MeasurementSpec, ResourcesSpec, WorkloadSpec
from explorer.trial_config import TrialConfig

__all__ = ["TrialJob"]


@dataclass(frozen=True, kw_only=True)
class TrialJob:
    """The typed hand-over from the launcher to the worker processes of one trial."""

    trial_number: int
    config: TrialConfig
    workload: WorkloadSpec
    measurement: MeasurementSpec
    resources: ResourcesSpec
    model_path: str | None = None
    """Resolved local model directory or hub id (``None`` for an architecture)."""
    dataset_path: str | None = None
    """Resolved JSONL path (``None`` for synthetic data)."""
    fault: InjectedFault | None = None
    """A fault injected into this attempt (a study's ``faults:``; :mod:`explorer.fault`)."""
    worst_case_step: bool = True
    """Train one step on a batch of full-length entries after the measured window, where batches
    change shape (:mod:`explorer.worker._worst_case`). Only a job written by hand turns it off (to
    show what a trial without it would miss); no study file can."""

    @classmethod
    def for_study(
        cls,
        loaded: LoadedStudy,
        config: TrialConfig,
        *,
        trial_number: int,
        resources: ResourcesSpec | None = None,
        fault: InjectedFault | None = None,
    ) -> TrialJob:
        """The job that runs ``config`` on ``loaded``'s workload (optionally on other resources)."""
        spec = loaded.spec
        return cls(
            trial_number=trial_number,
            config=config,
            workload=spec.workload,
            measurement=spec.measurement,
            resources=resources or spec.resources,
            model_path=loaded.model_path,
            dataset_path=str(loaded.dataset_path) if loaded.dataset_path else None,
            fault=fault,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "trial_number": self.trial_number,
                "config": self.config.to_dict(),
                "workload": self.workload.model_dump(mode="json"),
                # unset fields stay unset: the stop rule in force depends on what was given
                "measurement": self.measurement.model_dump(mode="json", exclude_unset=True),
                "resources": self.resources.model_dump(mode="json"),
                "model_path": self.model_path,
                "dataset_path": self.dataset_path,
                "fault": self.fault.to_dict() if self.fault else None,
                "worst_case_step": self.worst_case_step,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> TrialJob:
        data = json.loads(text)
        return cls(
            trial_number=data["trial_number"],
            config=TrialConfig.from_dict(data["config"]),
            workload=WorkloadSpec.model_validate(data["workload"]),
            measurement=MeasurementSpec.model_validate(data["measurement"]),
            resources=ResourcesSpec.model_validate(data["resources"]),
            model_path=data["model_path"],
            dataset_path=data["dataset_path"],
            fault=InjectedFault.from_dict(data["fault"]) if data.get("fault") else None,
            worst_case_step=bool(data.get("worst_case_step", True)),
        )
