"""System metrics during the measured window, with the seeds' names; and the hardware fingerprint.

GPUs are read through NVML (``nvidia-ml-py``), restricted to the trial's visible devices; the CPU
through psutil. Without a GPU the GPU metrics are 0.0, as the seeds say. The NVML path runs here
only against a fake NVML module in the tests (no GPU in this project).
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from typing import Any

import psutil

__all__ = ["SystemSampler", "fingerprint", "load_nvml"]

GPU_KEYS = ("gpu_compute_utilization", "gpu_memory_utilization", "gpu_power_watts", "gpu_power_percent")


def load_nvml() -> Any | None:
    """The ``pynvml`` module, initialised, or ``None`` when there is no NVML (no driver, no GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # ImportError, or NVMLError when no driver is loaded: no GPU metrics
        return None


def _visible_handles(nvml: Any) -> list[Any]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        ids: list[str] = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
    else:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    handles = []
    for ident in ids:
        if ident.startswith(("GPU-", "MIG-")):
            handles.append(nvml.nvmlDeviceGetHandleByUUID(ident))
        else:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(ident)))
    return handles


class SystemSampler:
    """Samples GPU (NVML) and process CPU (psutil) metrics on a thread, every ``interval`` seconds."""

    def __init__(self, *, interval: float = 0.5, nvml: Any | None = None, pid: int | None = None) -> None:
        self.interval = interval
        self.nvml = nvml
        self.handles = _visible_handles(nvml) if nvml is not None else []
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
        for h in self.handles:
            util = nvml.nvmlDeviceGetUtilizationRates(h)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            watts = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            limit = nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            gpu["gpu_compute_utilization"].append(float(util.gpu))
            gpu["gpu_memory_utilization"].append(float(util.memory))
            gpu["memory_used_percent"].append(100.0 * mem.used / mem.total)
            gpu["gpu_power_watts"].append(watts)
            gpu["gpu_power_percent"].append(100.0 * watts / limit if limit else 0.0)
        for key, values in gpu.items():
            row[key] = sum(values) / len(values) if values else 0.0
        row["memory_used_percent_max"] = max(gpu["memory_used_percent"], default=0.0)
        return row

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
        "python": platform.python_version(),
        "explorer": ver("explorer"),
    }
