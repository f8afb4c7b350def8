"""The GPU model a study's trials run on: declared in the study file, or read from the device.

``resources.gpu_model`` has no default: a guessed model (it once was an A100) priced CPU trials as
A100s and asked a cluster for GPUs it may not have. When the study file leaves it out:

* ``device: cpu``: :data:`CPU_MODEL`;
* the local launcher on ``cuda`` (or ``auto``): the name NVML gives this machine's first visible
  GPU, hyphenated as Ray and the studies write it (``NVIDIA H100 80GB HBM3`` ->
  ``NVIDIA-H100-80GB-HBM3``); ``auto`` on a machine without one runs on the CPU: :data:`CPU_MODEL`;
* a Ray cluster or a replay table: refused (the model cannot be read from here);
* a command that only reads a stored study (status, report, plan, ...): the model stored with the
  study (its identity), which is what its trials were measured on.

A declared model that contradicts this machine's GPU (local launcher, ``cuda``/``auto``) is
refused in one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from explorer.errors import SpecError
from explorer.gpus import missing_figures
from explorer.launch import accelerator_type, launcher_kind
from explorer.spec import StudySpec

__all__ = ["CPU_MODEL", "check_priced", "device_gpu_model", "hyphenated", "with_gpu_model"]

CPU_MODEL = "CPU-logical"
"""The GPU model of trials that run on the CPU, where the study file names none: the CPU's
processes standing in for GPUs (Ray's logical GPUs), as the CPU studies name it. Not ``CPU``:
the model is also a Ray resource, and Ray keeps ``CPU`` for its cores."""
FIELD = "resources.gpu_model"


def hyphenated(name: str) -> str:
    """A device name as the studies and Ray write a GPU model: runs of spaces and underscores as
    one hyphen (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``)."""
    return re.sub(r"[\s_]+", "-", name.strip())


def load_nvml() -> Any | None:
    """``pynvml`` (nvidia-ml-py, the ``gpu`` extra), initialised; ``None`` without it or without
    an NVIDIA driver."""
    try:
        import pynvml  # type: ignore[import-not-found, unused-ignore]

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # ImportError, or NVMLError when no driver is loaded: no GPU to read
        return None


def device_gpu_model(nvml: Any | None = None) -> str | None:
    """The model of this machine's first visible NVIDIA GPU, read through NVML (``nvml``: the
    ``pynvml`` module, or a stand-in in tests), hyphenated; ``None``: no NVML, or no GPU."""
    nvml = nvml if nvml is not None else load_nvml()
    if nvml is None or nvml.nvmlDeviceGetCount() < 1:
        return None
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if visible.startswith(("GPU-", "MIG-")):
        handle = nvml.nvmlDeviceGetHandleByUUID(visible)
    else:
        handle = nvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
    name = nvml.nvmlDeviceGetName(handle)
    return hyphenated(name.decode() if isinstance(name, bytes) else str(name))


def _same_model(declared: str, device: str) -> bool:
    """Whether a declared model names the device's: the same name, hyphens, spaces and case
    aside, or the same Ray accelerator type (``H100`` for ``NVIDIA-H100-80GB-HBM3``)."""
    if hyphenated(declared).casefold() == device.casefold():
        return True
    return accelerator_type(declared).casefold() == accelerator_type(device).casefold() != device.casefold()


def _local(spec: StudySpec) -> bool:
    """The trials run on this machine (the Ray launcher with no cluster address)."""
    return launcher_kind(spec).local(spec)


def check_priced(spec: StudySpec, label: str) -> None:
    """Refuse a CUDA study on a GPU that the table of GPUs (:mod:`explorer.gpus`) does not know and
    whose figures the study does not declare (``resources.gpu``): it is never priced as another card.

    Raises:
        SpecError: one line naming the figures to declare.
    """
    r = spec.resources
    if r.device == "cpu":
        return
    for model in r.models:
        problem = missing_figures(model, r.gpu) if model != "unknown" else None
        if problem is not None:
            raise SpecError(file=label, field="resources.gpu", problem=problem)


def with_gpu_model(
    spec: StudySpec,
    label: str,
    *,
    probe: bool,
    stored: Callable[[], str | None],
    nvml: Any | None = None,
) -> tuple[StudySpec, str | None]:
    """``spec`` with ``resources.gpu_model`` set (see the module docstring), and the model a
    declared one was checked against (``None``: not checked).

    Args:
        probe: read this machine's GPU (``optimize``, ``validate``, ``measure``); ``False``: a
            command that only reads a stored study, which takes the stored model (``stored``).
        nvml: instead of ``pynvml`` (a test's stand-in).

    Raises:
        SpecError: the model cannot be known, the declared one is not this machine's GPU, or
            (``probe``) it is a GPU that is neither in the table nor declared (:func:`check_priced`).
    """
    resolved, device = _resolved(spec, label, probe=probe, stored=stored, nvml=nvml)
    if probe:
        check_priced(resolved, label)
    return resolved, device


def _resolved(
    spec: StudySpec,
    label: str,
    *,
    probe: bool,
    stored: Callable[[], str | None],
    nvml: Any | None,
) -> tuple[StudySpec, str | None]:
    """:func:`with_gpu_model` before the check that the model is priced."""
    r = spec.resources
    cuda = r.device != "cpu"
    if r.gpu_model is not None:
        device = device_gpu_model(nvml) if probe and cuda and _local(spec) and not r.gpu_models else None
        if device is not None and not _same_model(r.gpu_model, device):
            raise SpecError(
                file=label,
                field=FIELD,
                problem=f"{r.gpu_model}, but this machine's GPU is {device} (NVML): declare {device}, "
                "or leave gpu_model out to read it from the device",
            )
        return spec, device
    if not cuda:
        return _set(spec, CPU_MODEL, label), None
    refused = launcher_kind(spec).gpu_model_refusal(spec, probe=probe)
    if refused is not None:  # a replay table's rows, a cluster's nodes: not readable from here
        raise SpecError(file=label, field=FIELD, problem=refused)
    if not probe:
        model = stored()
        return _set(
            spec, model if model is not None else CPU_MODEL if r.device == "auto" else "unknown", label
        ), None
    device = device_gpu_model(nvml)
    if device is None and r.device == "cuda":
        raise SpecError(
            file=label,
            field=FIELD,
            problem="not given, and NVML reads no GPU on this machine (install explorer[gpu] for "
            "nvidia-ml-py): declare it, e.g. NVIDIA-H100-80GB-HBM3",
        )
    return _set(spec, device or CPU_MODEL, label), device


def _set(spec: StudySpec, model: str, label: str) -> StudySpec:
    """``spec`` with ``resources.gpu_model`` set to ``model``, checked again as a whole (a price
    for it, where an objective needs one)."""
    from pydantic import ValidationError

    from explorer.spec._load import pydantic_error

    resources = spec.resources.model_copy(update={"gpu_model": model})
    try:
        return StudySpec.model_validate(spec.model_copy(update={"resources": resources}).model_dump())
    except ValidationError as exc:
        raise pydantic_error(label, exc) from None
