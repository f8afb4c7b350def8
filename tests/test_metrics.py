"""The system-metrics sampler: real psutil on this CPU; NVML through a fake module (no GPU here)."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from explorer.worker._metrics import (
    SystemSampler,
    cuda_device_uuids,
    fingerprint,
    load_nvml,
    nvml_uuid,
    trial_pids,
)


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

    Three devices, known by UUID. NVML's index order (the PCI bus) is not CUDA's, so selecting by
    index is an error here. Each reading of device i returns the next value of its scripted
    series; each device runs one process of the trial (``ours``) beside another tenant's.
    """

    UUIDS = (
        "GPU-5a1e0000-0000-0000-0000-00000000000a",
        "GPU-5a1e0000-0000-0000-0000-00000000000b",
        "GPU-5a1e0000-0000-0000-0000-00000000000c",
    )

    def __init__(self, ours: int = 0, used_by_ours: int | None = 4 * 2**30):
        self.util = {0: [10, 20, 30], 1: [50, 60, 70], 2: [99, 99, 99]}
        self.calls = {0: 0, 1: 0, 2: 0}
        self.ours = ours
        self.used_by_ours = used_by_ours

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        raise AssertionError("a device selected by index (NVML's order is not CUDA's)")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.UUIDS.index(uuid)

    def nvmlDeviceGetUtilizationRates(self, h):
        k = self.calls[h]
        self.calls[h] += 1
        v = self.util[h][min(k, 2)]
        return SimpleNamespace(gpu=v, memory=v / 2)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h + 1) * 10 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        other = SimpleNamespace(pid=999_999, usedGpuMemory=(h + 1) * 10 * 2**30 - 2**30)
        return [other, SimpleNamespace(pid=self.ours + h, usedGpuMemory=self.used_by_ours)]

    def nvmlDeviceGetPowerUsage(self, h):
        return 350_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlSystemGetDriverVersion(self):
        return b"580.00"


def test_nvml_devices_selected_by_uuid_and_memory_of_the_trial():
    """The trial's GPUs are devices a and b (c belongs to another trial), as torch names them."""
    nvml = FakeNVML(ours=4000)
    bare = [u.removeprefix("GPU-") for u in FakeNVML.UUIDS[:2]]  # torch's spelling
    sampler = SystemSampler(nvml=nvml, devices=bare, pids=lambda: {4000, 4001})
    assert sampler.handles == [0, 1]
    sampler.samples = [(float(i), sampler.sample()) for i in range(3)]
    s = sampler.summary()
    # per sample, the mean of the trial's devices: (10+50)/2, (20+60)/2, (30+70)/2
    assert (
        s["gpu_compute_utilization_min"],
        s["gpu_compute_utilization_avg"],
        s["gpu_compute_utilization_max"],
    ) == (30.0, 40.0, 50.0)
    assert s["gpu_memory_utilization_avg"] == 20.0
    assert s["gpu_power_watts_avg"] == 350.0 and s["gpu_power_percent_max"] == 50.0
    # the trial's own 4 GiB of 80, not the device's 20 GiB (the other tenant's 19 included)
    assert s["gpu_memory_utilization_peak"] == 5.0
    assert sampler.record() == {"devices": list(FakeNVML.UUIDS[:2]), "memory_counts": "trial processes"}
    assert s["cpu_compute_utilization"] >= 0.0
    assert fingerprint(nvml=nvml)["driver_version"] == "580.00"


@pytest.mark.parametrize(
    "ours,held", [(123, 4 * 2**30), (4000, None)], ids=["other-pid-namespace", "not-available"]
)
def test_nvml_memory_of_the_whole_device_says_so(ours, held):
    """NVML names none of the trial's processes (a container's PID namespace), or cannot say
    what they hold: the device's whole use, and the record says it counts the other tenants."""
    sampler = SystemSampler(
        nvml=FakeNVML(ours=ours, used_by_ours=held), devices=[FakeNVML.UUIDS[1]], pids=lambda: {4000, 4001}
    )
    assert sampler.sample()["memory_used_percent_max"] == 25.0  # device b: 20 of 80 GiB
    assert sampler.record()["memory_counts"] == "whole device (other processes included)"


def test_the_trials_processes_come_from_the_rank_records(tmp_path):
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0, "pid": 4000}))
    (tmp_path / "rank-1.json").write_text(json.dumps({"rank": 1, "pid": 4001}))
    (tmp_path / "rank-2.json").write_text("{")  # being written
    assert trial_pids(tmp_path) == {4000, 4001, os.getpid()}


def test_uuids_come_from_cuda_not_from_indices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # indices: never read as NVML's
    assert cuda_device_uuids() == []  # no CUDA device in this process
    assert SystemSampler(nvml=FakeNVML()).handles == []
    assert nvml_uuid("5a1e") == "GPU-5a1e" and nvml_uuid("MIG-5a1e") == "MIG-5a1e"
