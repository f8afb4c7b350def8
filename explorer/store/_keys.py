"""What a stored measurement is keyed by, besides the canonical configuration.

A measurement depends on the configuration (:meth:`~explorer.trial_config.TrialConfig.key`), on
the job around it (the workload and how it is measured) and on the hardware it ran on. The two
latter are digests of the study file's typed sections, so that two studies that describe the same
job on the same hardware share their measurements, whatever their names or files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["StoreScope", "hardware_key", "workload_key"]

DIGEST_CHARS = 16
"""Hex characters kept of a sha256 (64 bits: no collision among any plausible number of studies)."""


def _digest(data: Any) -> str:
    """sha256 of the canonical JSON of ``data`` (sorted keys, no spaces), shortened."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def workload_key(loaded: LoadedStudy) -> str:
    """A digest of everything apart from the configuration and the hardware that shapes a measurement.

    It holds:

    * the whole ``workload`` section (model, dataset, default sequence length, method with the LoRA
      settings, ``torch_dtype``), with the model and dataset paths replaced by the loader's
      resolved ones (a relative path means different files next to different study files);
    * the ``measurement`` section (stop rule, warmup, step budget, ...) with the rule in force
      spelled out (it depends on which fields the file gave, which a dump does not show), and
      without ``trial_timeout_s``: a timeout only decides whether a trial fails, and a failed
      trial is never stored;
    * ``launcher.runner`` (torchrun or accelerate start the ranks differently).

    The model's weights are not read: a checkpoint changed in place under the same path keeps its
    key (throughput does not depend on the weights' values).
    """
    spec = loaded.spec
    workload = spec.workload.model_dump(mode="json")
    workload["model"]["path"] = loaded.model_path
    workload["dataset"]["path"] = str(loaded.dataset_path) if loaded.dataset_path else None
    measurement = spec.measurement.model_dump(mode="json", exclude={"trial_timeout_s"})
    measurement["stop"] = spec.measurement.rule
    return _digest({"workload": workload, "measurement": measurement, "runner": spec.launcher.runner})


def hardware_key(loaded: LoadedStudy) -> str:
    """A digest of the hardware a study's trials run on.

    * Ray launcher: the ``resources`` section as the study file states it (``gpu_model``,
      ``device``, the ``device_memory_gib`` cap, ``gpus_per_node``, ``nodes``,
      ``cpus_per_trial_process``). The hardware is what the study file says it is; the machine a
      measurement actually ran on is in the stored measurement (its ``fingerprint``), not in the
      key.
    * Replay launcher: ``replay:`` and a digest of the table file's bytes and the ``gpu_model``
      that selects its rows, so that answers read from a table never stand in for real hardware,
      nor for another table, and a table edited in place is a new table.

    With several GPU models (``resources.gpu_models``, also in the digest) the trial's own model is
    in its configuration key (the ``gpu_model`` knob, where the study searches it), so two models'
    measurements never share a key; one model's digest is that of earlier versions.
    """
    spec = loaded.spec
    resources = spec.resources
    models = {"gpu_models": dict(sorted(resources.gpu_models.items()))} if resources.gpu_models else {}
    if spec.launcher.kind == "replay":
        assert loaded.replay_table is not None  # the loader read and checked it
        table = hashlib.sha256(loaded.replay_table.path.read_bytes()).hexdigest()
        return "replay:" + _digest({"table_sha256": table, "gpu_model": resources.gpu_model, **models})
    return _digest(
        {
            "gpu_model": resources.gpu_model,
            "device": resources.device,
            "device_memory_gib": resources.device_memory_gib,
            "gpus_per_node": resources.gpus_per_node,
            "nodes": resources.nodes,
            "cpus_per_trial_process": resources.cpus_per_trial_process,
            **models,
        }
    )


@dataclass(frozen=True, kw_only=True)
class StoreScope:
    """The part of a store key a whole study shares: its workload and its hardware."""

    workload_key: str
    hardware_key: str

    @classmethod
    def for_study(cls, loaded: LoadedStudy) -> StoreScope:
        """The scope of ``loaded``'s trials (see :func:`workload_key` and :func:`hardware_key`)."""
        return cls(workload_key=workload_key(loaded), hardware_key=hardware_key(loaded))
