"""System metrics during the measured window, with the seeds' names; and the hardware fingerprint.

GPUs are read through NVML (``nvidia-ml-py``): the trial's devices, selected by UUID, and the
memory its own processes hold there (or the device's, said so, where NVML cannot tell); the CPU
through psutil. Without a GPU the GPU metrics are 0.0, as the seeds say. The NVML path runs here
only against a fake NVML module in the tests (no GPU in this project).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "SystemSampler",
    "cuda_device_uuids",
    "fingerprint",
    "load_nvml",
    "nvml_handles",
    "nvml_uuid",
    "trial_pids",
]

GPU_KEYS = ("gpu_compute_utilization", "gpu_memory_utilization", "gpu_power_watts", "gpu_power_percent")


def load_nvml() -> Any | None:
    """The ``pynvml`` module, initialised, or ``None`` when there is no NVML (no driver, no GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # ImportError, or NVMLError when no driver is loaded: no GPU metrics
        return None


def cuda_device_uuids() -> list[str]:
    """The UUIDs of the CUDA devices this process sees, in torch's order (NVML's spelling:
    :func:`nvml_uuid`).

    Read from the CUDA driver through torch, never from indices: ``CUDA_VISIBLE_DEVICES`` indices
    follow CUDA's device order (fastest first by default), NVML's follow the PCI bus, and on a
    node whose GPUs are shared out the two pick different devices.
    """
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        nvml_uuid(str(torch.cuda.get_device_properties(i).uuid)) for i in range(torch.cuda.device_count())
    ]


def nvml_uuid(uuid: str) -> str:
    """``GPU-<uuid>`` as NVML names a device (torch gives the bare UUID; MIG ones keep ``MIG-``)."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def nvml_handles(nvml: Any, uuids: list[str]) -> list[Any]:
    """NVML's handle of each device, selected by UUID (never by index)."""
    return [nvml.nvmlDeviceGetHandleByUUID(nvml_uuid(u)) for u in uuids]


def trial_pids(out_dir: Path) -> set[int]:
    """The process ids of this trial's ranks on this node, from the ``rank-<r>.json`` records
    each rank writes when it starts (with this process's own)."""
    pids = {os.getpid()}
    for path in out_dir.glob("rank-*.json"):
        try:
            pids.add(int(json.loads(path.read_text())["pid"]))
        except (OSError, ValueError, KeyError):  # a record being written: the next sample reads it
            continue
    return pids


def _memory_used(nvml: Any, handle: Any, pids: set[int]) -> tuple[int, bool]:
    """(bytes, only the trial's): the memory the trial's processes hold on the device, from
    NVML's list of compute processes; the device's whole use (other processes included) when
    NVML names none of them or cannot say how much they hold (a container's PID namespace)."""
    held = [p.usedGpuMemory for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in pids]
    if held and all(isinstance(b, int) for b in held):
        return sum(held), True
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used), False


class SystemSampler:
    """Samples GPU (NVML) and process CPU (psutil) metrics on a thread, every ``interval`` seconds."""

    def __init__(
        self,
        *,
        interval: float = 0.5,
        nvml: Any | None = None,
        devices: list[str] | None = None,
        pids: Callable[[], set[int]] | None = None,
        pid: int | None = None,
    ) -> None:
        """``devices``: the trial's GPUs by UUID (``None``: :func:`cuda_device_uuids`); ``pids``:
        the trial's processes (``None``: this one), whose memory on the GPUs is counted."""
        self.interval = interval
        self.nvml = nvml
        wanted = (cuda_device_uuids() if devices is None else devices) if nvml is not None else []
        self.devices = [nvml_uuid(u) for u in wanted]
        self.handles = nvml_handles(nvml, self.devices) if nvml is not None else []
        self.pids = pids or (lambda: {os.getpid()})
        self.memory_scope: set[bool] = set()
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="explorer-metrics", daemon=True)

    def start(self) -> None:
        self.proc.cpu_percent(None)  # the first reading is always 0.0: prime it
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> dict[str, float]:
        """One reading, averaged over the visible GPUs."""
        row = {
            "cpu_compute_utilization": self.proc.cpu_percent(None),
            "cpu_memory_utilization": self.proc.memory_percent(),
        }
        gpu: dict[str, list[float]] = {k: [] for k in GPU_KEYS}
        gpu["memory_used_percent"] = []
        nvml: Any = self.nvml
        pids = self.pids() if self.handles else set()
        for h in self.handles:
            util = nvml.nvmlDeviceGetUtilizationRates(h)
            total = nvml.nvmlDeviceGetMemoryInfo(h).total
            used, ours = _memory_used(nvml, h, pids)
            self.memory_scope.add(ours)
            watts = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            limit = nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            gpu["gpu_compute_utilization"].append(float(util.gpu))
            gpu["gpu_memory_utilization"].append(float(util.memory))
            gpu["memory_used_percent"].append(100.0 * used / total)
            gpu["gpu_power_watts"].append(watts)
            gpu["gpu_power_percent"].append(100.0 * watts / limit if limit else 0.0)
        for key, values in gpu.items():
            row[key] = sum(values) / len(values) if values else 0.0
        row["memory_used_percent_max"] = max(gpu["memory_used_percent"], default=0.0)
        return row

    def record(self) -> dict[str, Any]:
        """Which GPUs were read (by NVML UUID) and whose memory ``gpu_memory_utilization_peak``
        counts: the trial's processes, or the whole device (other processes included)."""
        scopes = {
            frozenset({True}): "trial processes",
            frozenset({False}): "whole device (other processes included)",
        }
        counts = scopes.get(frozenset(self.memory_scope), "mixed" if self.memory_scope else "none")
        return {"devices": list(self.devices), "memory_counts": counts}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append((time.perf_counter(), self.sample()))

    def summary(self, *, since: float = 0.0) -> dict[str, float]:
        """The seeds' properties over the samples taken after ``since`` (a perf_counter time)."""
        rows = [r for t, r in self.samples if t >= since] or [self.sample()]
        out: dict[str, float] = {}
        for key in GPU_KEYS:
            values = [r[key] for r in rows]
            out[f"{key}_min"] = min(values)
            out[f"{key}_avg"] = sum(values) / len(values)
            out[f"{key}_max"] = max(values)
        out["gpu_memory_utilization_peak"] = max(r["memory_used_percent_max"] for r in rows)
        out["cpu_compute_utilization"] = sum(r["cpu_compute_utilization"] for r in rows) / len(rows)
        out["cpu_memory_utilization"] = sum(r["cpu_memory_utilization"] for r in rows) / len(rows)
        return out


def _cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo on Linux (psutil and platform do not give it), else
    what platform knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
    except OSError:  # not Linux
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def fingerprint(*, nvml: Any | None) -> dict[str, Any]:
    """Hardware and software of this trial: what a measurement is only valid for."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    cuda = torch.cuda.is_available()
    driver = "none"
    if nvml is not None:
        raw = nvml.nvmlSystemGetDriverVersion()
        driver = raw.decode() if isinstance(raw, bytes) else str(raw)
    return {
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "gpu_model": torch.cuda.get_device_name(0) if cuda else "none",
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "driver_version": driver,
        "cuda_version": torch.version.cuda or "none",
        "torch": torch.__version__,
        "transformers": ver("transformers"),
        "accelerate": ver("accelerate"),
        "peft": ver("peft"),
        "trl": ver("trl"),
        "python": platform.python_version(),
        "explorer": ver("explorer"),
    }
