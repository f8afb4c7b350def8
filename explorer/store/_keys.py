"""What a stored measurement is keyed by, besides the canonical configuration.

A measurement depends on the configuration (:meth:`~explorer.trial_config.TrialConfig.key`), on
the job around it (the workload and how it is measured) and on the hardware it ran on. The two
latter are digests of the study file's typed sections, so that two studies that describe the same
job on the same hardware share their measurements, whatever their names or files.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["IDENTITY_SECTIONS", "StoreScope", "hardware_key", "job_identity", "workload_key"]

DIGEST_CHARS = 16
"""Hex characters kept of a sha256 (64 bits: no collision among any plausible number of studies)."""


def _digest(data: Any) -> str:
    """sha256 of the canonical JSON of ``data`` (sorted keys, no spaces), shortened."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def _file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (read once per process while its size and mtime stay the same:
    a dataset may be large, and a run asks for its identity and keys a few times)."""
    stat = path.stat()
    return _sha256_of(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of the file at ``path`` (``size`` and ``mtime_ns`` key the cache), in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _workload(loaded: LoadedStudy) -> dict[str, Any]:
    """The ``workload`` section as it shapes a measurement: the study file's, with the model and
    dataset paths replaced by the loader's resolved ones (a relative path means different files
    next to different study files), and what those paths hold: a JSONL dataset's content
    (``dataset.sha256``) and a local model folder's ``config.json`` (``model.config_sha256``). A
    synthetic dataset and a model built from its architecture add nothing (their fields say it
    all), so their digests are those of earlier versions."""
    workload = loaded.spec.workload.model_dump(mode="json")
    workload["model"]["path"] = loaded.model_path
    local = loaded.model_path is not None and Path(loaded.model_path).is_absolute()  # not a hub id
    config = Path(loaded.model_path or "") / "config.json"
    if local and config.is_file():
        workload["model"]["config_sha256"] = _file_sha256(config)
    workload["dataset"]["path"] = str(loaded.dataset_path) if loaded.dataset_path else None
    if loaded.dataset_path is not None and loaded.dataset_path.is_file():
        workload["dataset"]["sha256"] = _file_sha256(loaded.dataset_path)
    return workload


def _hardware(loaded: LoadedStudy) -> dict[str, Any]:
    """The ``resources`` fields that describe the hardware of a study's trials (the GPU model or
    models first, as :func:`job_identity` names them)."""
    resources = loaded.spec.resources
    models = {"gpu_models": dict(sorted(resources.gpu_models.items()))} if resources.gpu_models else {}
    return {
        "gpu_model": resources.gpu_model,
        **models,
        "device": resources.device,
        "device_memory_gib": resources.device_memory_gib,
        "gpus_per_node": resources.gpus_per_node,
        "nodes": resources.nodes,
        "cpus_per_trial_process": resources.cpus_per_trial_process,
    }


IDENTITY_SECTIONS: dict[str, tuple[str, ...] | None] = {
    "workload": None,
    "resources": ("gpu_model", "gpu_models", "device", "device_memory_gib"),
}
"""What a study's identity holds of each section (``None``: all of it): the whole workload, and
the hardware fields that change what a trial measures. ``gpus_per_node`` and ``nodes`` are left
out: they only bound the GPU counts tried (as the search space does), and
``cpus_per_trial_process`` is a setting of the trials, like the measurement section's."""


def _flatten(data: Any, prefix: str) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"prefix.a.b": 1}``; a list or scalar is one value."""
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}"))
    return out


def job_identity(loaded: LoadedStudy) -> dict[str, Any]:
    """What defines a study's job, field by field in study-file order (``workload.model.name``,
    ``workload.model.architecture.hidden_size``, ..., ``resources.gpu_model``, ...): the values
    its measurement-store keys are digests of (:func:`workload_key`, :func:`hardware_key`), less
    the measurement settings and the capacity (:data:`IDENTITY_SECTIONS`). A study keeps the
    identity it was created with (:func:`explorer.study.open_study`)."""
    sections = {"workload": _workload(loaded), "resources": _hardware(loaded)}
    identity: dict[str, Any] = {}
    for name, keep in IDENTITY_SECTIONS.items():
        values = {k: v for k, v in sections[name].items() if keep is None or k in keep}
        identity.update(_flatten(values, name))
    return identity


def workload_key(loaded: LoadedStudy) -> str:
    """A digest of everything apart from the configuration and the hardware that shapes a measurement.

    It holds:

    * the whole ``workload`` section (model, dataset, default sequence length, method with the LoRA
      settings, ``torch_dtype``), as :func:`_workload` resolves it (paths, and a JSONL dataset's
      and a local model's ``config.json``'s content);
    * the ``measurement`` section (stop rule, warmup, step budget, ...) with the rule in force
      spelled out (it depends on which fields the file gave, which a dump does not show), and
      without ``trial_timeout_s``: a timeout only decides whether a trial fails, and a failed
      trial is never stored;
    * what the launcher's section changes of a measurement (its ``workload_identity``: the Ray
      launcher's ``runner``, as torchrun or accelerate start the ranks differently; a replay
      keeps ``torchrun``).

    The model's weights are not read: a checkpoint changed in place under the same path keeps its
    key (throughput does not depend on the weights' values).
    """
    from explorer.launch import launcher_kind

    spec = loaded.spec
    measurement = spec.measurement.model_dump(mode="json", exclude={"trial_timeout_s"})
    measurement["stop"] = spec.measurement.rule
    launcher = launcher_kind(spec).workload_identity(spec)
    return _digest({"workload": _workload(loaded), "measurement": measurement, **launcher})


def hardware_key(loaded: LoadedStudy) -> str:
    """A digest of the hardware a study's trials run on.

    * By default (the Ray launcher): the ``resources`` section as the study file states it (``gpu_model``,
      ``device``, the ``device_memory_gib`` cap, ``gpus_per_node``, ``nodes``,
      ``cpus_per_trial_process``). The hardware is what the study file says it is; the machine a
      measurement actually ran on is in the stored measurement (its ``fingerprint``), not in the
      key.
    * A launcher whose answers come from elsewhere (its ``hardware_identity``): its name, ``:``
      and a digest of that identity. The replay launcher's is the table file's bytes and the
      ``gpu_model`` that selects its rows, so that answers read from a table never stand in for
      real hardware, nor for another table, and a table edited in place is a new table.

    With several GPU models (``resources.gpu_models``, also in the digest) the trial's own model is
    in its configuration key (the ``gpu_model`` knob, where the study searches it), so two models'
    measurements never share a key; one model's digest is that of earlier versions.
    """
    from explorer.launch import launcher_kind

    kind = launcher_kind(loaded.spec)
    own = kind.hardware_identity(loaded)
    return f"{kind.name}:" + _digest(own) if own is not None else _digest(_hardware(loaded))


@dataclass(frozen=True, kw_only=True)
class StoreScope:
    """The part of a store key a whole study shares: its workload and its hardware."""

    workload_key: str
    hardware_key: str

    @classmethod
    def for_study(cls, loaded: LoadedStudy) -> StoreScope:
        """The scope of ``loaded``'s trials (see :func:`workload_key` and :func:`hardware_key`)."""
        return cls(workload_key=workload_key(loaded), hardware_key=hardware_key(loaded))
