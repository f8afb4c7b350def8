"""GPU integration suite: the CUDA path of the same functions. Never run in this project's CI.

Passed 4 of 4 on one H100 (torch 2.11+cu130, transformers 5.17), and 6 of 6 with the injected-fault
cases in a later session; see the README. The compiled-trial cases (issue 15) have not run on a
GPU yet. With one GPU,
the DDP and FSDP cases run as one-process trials.

Run on a machine with NVIDIA GPUs (a CUDA build of torch and nvidia-ml-py installed):

    pytest -m gpu

Selecting these tests on a machine without CUDA fails them on purpose: they are deselected by the
default ``-m 'not slow and not gpu'``, never skipped.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from explorer.launch import run_trial
from explorer.measurement import Outcome
from tests.builders import CUDA_ONE_GPU, TINY_GRANITE

pytestmark = pytest.mark.gpu

CUDA = CUDA_ONE_GPU


@pytest.fixture(autouse=True)
def _needs_cuda():
    assert torch.cuda.is_available(), "pytest -m gpu needs a CUDA device"


@pytest.mark.parametrize(
    "parallel",
    [
        dict(distributed_backend="DDP"),
        dict(distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="SHARD_GRAD_OP"),
        dict(distributed_backend="FSDP", fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD"),
    ],
)
def test_cuda_trial(parallel, make_job, tmp_path):
    gpus = min(2, torch.cuda.device_count())
    config = parallel if gpus > 1 else dict(distributed_backend="NONE")
    job = make_job(
        CUDA if gpus == 1 else {"resources": CUDA["resources"] | {"gpus_per_node": gpus}},
        batch_size=8,
        number_gpus=gpus,
        **config,
    )
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=600)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    p = m.properties
    assert p is not None and p.device == "cuda" and p.peak_memory_allocated_gib > 0
    assert p.system["gpu_power_watts_avg"] > 0  # NVML really read
    assert 0 < p.mfu < 1
    assert m.extra["fingerprint"]["gpu_count"] >= 1


def test_cuda_oom_under_the_memory_cap(make_job, tmp_path):
    job = make_job(
        CUDA | {"resources": CUDA["resources"] | {"device_memory_gib": 0.05}},
        batch_size=512,
        number_gpus=1,
        distributed_backend="NONE",
    )
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=600)
    assert m.outcome is Outcome.OOM, m.error


@pytest.mark.parametrize("kind", ["oom", "crash"])
def test_injected_faults_on_cuda(kind, make_job, tmp_path):
    """The chaos faults' CUDA path: ``oom`` asks the GPU for 1 EiB (torch.OutOfMemoryError, no
    memory cap involved), ``crash`` ends rank 0; the trial is OOM, resp. FAILED."""
    from explorer.fault import InjectedFault

    job = make_job(
        CUDA,
        batch_size=8,
        number_gpus=1,
        distributed_backend="NONE",
    )
    job = dataclasses.replace(job, fault=InjectedFault(kind=kind, at_step=0))
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=600)
    if kind == "oom":
        assert m.outcome is Outcome.OOM and "OutOfMemoryError" in (m.error or ""), m.error
    else:
        assert m.outcome is Outcome.FAILED and "exit status 17" in (m.error or ""), m.error


@pytest.mark.parametrize("padding", ["max_length", "packed"])
def test_cuda_compiled_trial(padding, make_job, tmp_path):
    """``torch_compile`` on CUDA (issue 15: a granite trial trained, then failed with ``TypeError:
    GraniteForCausalLM does not support len()``): inductor's kernels in bf16, the trained model an
    OptimizedModule, every compile in the warmup, and (packed) one compile with dynamic shapes."""
    job = make_job(
        CUDA | {"workload": {"model": {"name": "tiny-granite", "architecture": TINY_GRANITE}}},
        batch_size=8,
        number_gpus=1,
        distributed_backend="NONE",
        padding=padding,
        torch_compile=True,
    )
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=600)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    p = m.properties
    assert p is not None and p.device == "cuda" and p.dataset_tokens_per_second > 0
    compiled = m.extra["compile"]
    assert compiled["compiled"] and compiled["dynamic"] == (padding == "packed")
    assert compiled["compiling_steps"][0] == 1 and max(compiled["compiling_steps"]) <= p.warmup_steps
    assert m.extra["wrapper"] == "GraniteForCausalLM"
