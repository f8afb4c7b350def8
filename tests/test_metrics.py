"""The system-metrics sampler: real psutil on this CPU; NVML through a fake module (no GPU here)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from explorer.worker._metrics import SystemSampler, fingerprint, load_nvml


def test_cpu_metrics_from_psutil_and_zero_gpu_metrics_without_gpu():
    assert load_nvml() is None  # this machine has no NVIDIA driver
    sampler = SystemSampler(interval=0.05, nvml=None)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    sampler.start()
    end = time.perf_counter() + 0.6
    x = 0
    while time.perf_counter() < end:  # keep this process busy
        x += sum(range(1000))
    sampler.stop()
    # what this process really got of a core, busy-looping (less on a loaded machine)
    got = 100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    summary = sampler.summary()
    assert len(sampler.samples) >= 5
    assert summary["cpu_compute_utilization"] > 0.3 * got > 0
    assert 0.0 < summary["cpu_memory_utilization"] < 100.0
    assert summary["gpu_compute_utilization_avg"] == 0.0 and summary["gpu_power_watts_max"] == 0.0


class FakeNVML:
    """FAKE NVML: the one allowed fake, standing in for nvidia-ml-py on a machine with no GPU.

    Three devices; each reading of device i returns the next value of its scripted series.
    """

    def __init__(self):
        self.util = {0: [10, 20, 30], 1: [50, 60, 70], 2: [99, 99, 99]}
        self.calls = {0: 0, 1: 0, 2: 0}

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetUtilizationRates(self, h):
        k = self.calls[h]
        self.calls[h] += 1
        v = self.util[h][min(k, 2)]
        return SimpleNamespace(gpu=v, memory=v / 2)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h + 1) * 10 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        return 350_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlSystemGetDriverVersion(self):
        return b"580.00"


def test_nvml_path_with_fake_nvml_restricted_to_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # device 2 belongs to another trial
    nvml = FakeNVML()
    sampler = SystemSampler(nvml=nvml)
    assert sampler.handles == [0, 1]
    sampler.samples = [(float(i), sampler.sample()) for i in range(3)]
    s = sampler.summary()
    # per sample, the mean of the visible devices: (10+50)/2, (20+60)/2, (30+70)/2
    assert (
        s["gpu_compute_utilization_min"],
        s["gpu_compute_utilization_avg"],
        s["gpu_compute_utilization_max"],
    ) == (
        30.0,
        40.0,
        50.0,
    )
    assert s["gpu_memory_utilization_avg"] == 20.0
    assert s["gpu_power_watts_avg"] == 350.0 and s["gpu_power_percent_max"] == 50.0
    assert s["gpu_memory_utilization_peak"] == 25.0  # device 1: 20 of 80 GiB
    assert s["cpu_compute_utilization"] >= 0.0
    assert fingerprint(nvml=nvml)["driver_version"] == "580.00"


def test_nvml_uuids(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa-2")
    assert SystemSampler(nvml=FakeNVML()).handles == [2]
