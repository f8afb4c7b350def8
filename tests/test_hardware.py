"""No guessed hardware (issue 22): ``resources.gpu_model`` has no default.

Left out, it is ``CPU-logical`` on the CPU and read from the device on CUDA (NVML); required on a
Ray cluster and for a replay table; a declared model that contradicts this machine's GPU is one
line. There is no GPU here: NVML is the one fake, :class:`FakeNVML`, passed at the boundary
(:func:`explorer.hardware.with_gpu_model`'s ``nvml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from explorer.errors import SpecError
from explorer.hardware import CPU_MODEL, device_gpu_model, with_gpu_model
from explorer.spec._load import study_spec
from explorer.study_file import load_study
from tests.builders import run_cli
from tests.conftest import BASE_STUDY, merge


class FakeNVML:
    """FAKE NVML: stands in for nvidia-ml-py on this machine, which has no GPU. Two devices,
    named as NVML names them (bytes, as older nvidia-ml-py returns)."""

    def __init__(self, name: str = "NVIDIA H100 80GB HBM3") -> None:
        self.name = name

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self.name.encode()


def _spec(tmp_path: Path, **resources: Any) -> Any:
    launcher = resources.pop("launcher", {})
    data = merge(BASE_STUDY, {"resources": {"gpu_model": None, **resources}, "launcher": launcher})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return study_spec(path)[0], str(path)


def _never_stored() -> str | None:
    raise AssertionError("a command that reads this machine's GPU does not read the storage")


def test_left_out_it_is_cpu_on_the_cpu_and_the_device_on_cuda(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec, label = _spec(tmp_path, device="cpu")
    assert spec.resources.gpu_model is None  # no default: nothing guessed
    assert with_gpu_model(spec, label, probe=True, stored=_never_stored)[0].resources.gpu_model == CPU_MODEL
    spec, label = _spec(tmp_path, device="cuda")
    resolved, device = with_gpu_model(spec, label, probe=True, stored=_never_stored, nvml=FakeNVML())
    assert resolved.resources.gpu_model == device == "NVIDIA-H100-80GB-HBM3"
    spec, label = _spec(tmp_path, device="auto")  # auto with a GPU runs on it
    assert (
        with_gpu_model(spec, label, probe=True, stored=_never_stored, nvml=FakeNVML())[1]
        == "NVIDIA-H100-80GB-HBM3"
    )


def test_a_declared_model_that_contradicts_the_device_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec, label = _spec(tmp_path, device="cuda", gpu_model="NVIDIA-A100-SXM4-80GB")
    with pytest.raises(SpecError) as err:
        with_gpu_model(spec, label, probe=True, stored=_never_stored, nvml=FakeNVML())
    assert str(err.value) == (
        f"{label}: resources.gpu_model: NVIDIA-A100-SXM4-80GB, but this machine's GPU is NVIDIA-H100-80GB-HBM3 "
        "(NVML): declare NVIDIA-H100-80GB-HBM3, or leave gpu_model out to read it from the device"
    )
    for same in ("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", "H100"):  # its name, or its Ray type
        spec, label = _spec(tmp_path, device="cuda", gpu_model=same)
        assert with_gpu_model(spec, label, probe=True, stored=_never_stored, nvml=FakeNVML())[0] is spec


def test_a_cluster_or_a_replay_table_needs_it_declared(tmp_path):
    spec, label = _spec(tmp_path, device="cuda", launcher={"address": "10.0.0.1:6379"})
    with pytest.raises(SpecError, match="resources.gpu_model: required on a Ray cluster: name the GPU model"):
        with_gpu_model(spec, label, probe=True, stored=_never_stored, nvml=FakeNVML())
    spec, label = _spec(tmp_path, device="cuda", launcher={"kind": "replay", "table": "t.csv"})
    with pytest.raises(SpecError, match="a replay study names the GPU model of its table's rows"):
        with_gpu_model(spec, label, probe=True, stored=_never_stored)


def test_a_reading_command_shows_the_model_the_study_measured(tmp_path):
    """``status``, ``report``, ``plan`` ... on another machine: the model stored with the study."""
    spec, label = _spec(tmp_path, device="cuda")
    resolved, _ = with_gpu_model(spec, label, probe=False, stored=lambda: "NVIDIA-H100-80GB-HBM3")
    assert resolved.resources.gpu_model == "NVIDIA-H100-80GB-HBM3"


def test_the_fake_reads_the_visible_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert device_gpu_model(FakeNVML("Tesla V100-SXM2-16GB")) == "Tesla-V100-SXM2-16GB"


def test_a_cpu_study_without_a_model_loads_as_cpu(tmp_path):
    """Through the loader: no A100 anywhere."""
    spec, label = _spec(tmp_path, device="cpu")
    loaded = load_study(label, check_model=False)
    assert loaded.spec.resources.gpu_model == CPU_MODEL
    assert "A100" not in yaml.safe_dump(loaded.spec.model_dump(mode="json"))


def test_validate_refuses_a_cuda_study_without_a_model_where_nvml_reads_no_gpu(tmp_path):
    if device_gpu_model() is not None:
        pytest.skip("NVML reads a GPU here: the model is read from it")
    _, label = _spec(tmp_path, device="cuda")
    proc = run_cli("validate", label, env={"RAY_ADDRESS": ""})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"{label}: resources.gpu_model: not given, and NVML reads no GPU on this machine" in line


@pytest.mark.slow  # a real CPU trial through Ray: in `make test-slow`
def test_a_cpu_study_without_a_model_measures_and_shows_cpu(tmp_path):
    """``optimize`` on a CPU study that names no model: its trial runs, and the identity stored
    with the study, ``export`` and ``plan`` all say CPU-logical."""
    import csv

    data = merge(
        BASE_STUDY,
        {
            "resources": {"gpu_model": None},
            "storage": f"sqlite:///{tmp_path}/s.db",
            "n_trials": 1,
            "sampler": {"kind": "grid"},
            "budget": {"tokens": 1e6},
        },
    )
    data["search_space"] = {
        "parameters": {
            "batch_size": {"values": [4]},
            "number_gpus": {"values": [1]},
            "gradient_checkpointing": {"choices": [False]},
        }
    }
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = run_cli("optimize", str(path), env={"RAY_ADDRESS": ""}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from explorer.study import open_existing_study

    study = open_existing_study(load_study(path, check_model=False))
    assert study.user_attrs["identity"]["resources.gpu_model"] == CPU_MODEL
    assert run_cli("export", str(path), "--out", str(tmp_path / "t.csv")).returncode == 0
    (row,) = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert row["gpu_model"] == CPU_MODEL and row["status"] == "ok"
    plan = run_cli("plan", str(path))
    assert plan.returncode == 0, plan.stderr
    assert CPU_MODEL in plan.stdout and "A100" not in plan.stdout
