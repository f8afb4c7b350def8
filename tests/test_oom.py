"""OOM or failure, from the exception's type and the allocators' own messages (issue 27, item 3).

The CUDA texts are torch 2.13's messages as a GPU run prints them (no GPU here); the CPU
allocator's message is produced for real. An illegal memory access, a cuBLAS or an NCCL error is
a failure recorded by its first line, never OOM: OOM inference would prune configurations that fit.
"""

from __future__ import annotations

import errno

import pytest
import torch

from explorer.launch import collect
from explorer.measurement import Outcome
from explorer.oom import failure_line, last_error_line, mentions_oom
from explorer.worker._memory import MemoryCap, is_oom

CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 19.68 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
    "11.88 GiB is free. Including non-PyTorch memory, this process has 67.22 GiB memory in use. Of the "
    "allocated memory 66.44 GiB is allocated by PyTorch, and 43.59 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
CUDA_ADVICE = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
ILLEGAL = "CUDA error: an illegal memory access was encountered" + CUDA_ADVICE
CUBLAS = (
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k, "
    "&falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, compute_type, "
    "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`"
)
NCCL = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run "
    "with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\nncclUnhandledCudaError: Call to CUDA "
    "function failed.\nLast error:\nCuda failure 'an illegal memory access was encountered'"
)


def _real_cpu_allocator_error() -> RuntimeError:
    """torch's CPU allocator refusing 1 PiB, for real."""
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**50, dtype=torch.uint8)
    return info.value


def _real_cap_error() -> MemoryError:
    """The project's own cap (a 1-byte budget) refusing a model that already exists."""
    cap = MemoryCap(1, torch.device("cpu"))
    cap.mark_baseline()
    keep = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB after the baseline
    with pytest.raises(MemoryError) as info:
        cap.enforce()
    del keep
    return info.value


OOM = {
    "torch.OutOfMemoryError": lambda: torch.OutOfMemoryError(CUDA_OOM),
    "CUDA OOM wrapped in a RuntimeError": lambda: RuntimeError(f"step 3 failed: {CUDA_OOM}"),
    "cudaErrorMemoryAllocation": lambda: torch.AcceleratorError("CUDA error: out of memory" + CUDA_ADVICE),
    "DefaultCPUAllocator (real)": _real_cpu_allocator_error,
    "the memory cap (real)": _real_cap_error,
    "OSError ENOMEM": lambda: OSError(errno.ENOMEM, "Cannot allocate memory"),
}
FAILED = {
    "illegal memory access": (
        lambda: torch.AcceleratorError(ILLEGAL),
        "AcceleratorError: CUDA error: an illegal memory access was encountered",
    ),
    "cuBLAS": (lambda: RuntimeError(CUBLAS), f"RuntimeError: {CUBLAS}"),
    "NCCL": (
        lambda: torch.distributed.DistBackendError(NCCL),
        "DistBackendError: " + NCCL.splitlines()[0],
    ),
    "device-side assert": (
        lambda: torch.AcceleratorError("CUDA error: device-side assert triggered" + CUDA_ADVICE),
        "AcceleratorError: CUDA error: device-side assert triggered",
    ),
    "a Python error": (lambda: ValueError("bad optim"), "ValueError: bad optim"),
}


@pytest.mark.parametrize("name", OOM)
def test_allocator_failures_are_oom(name):
    assert is_oom(OOM[name]())


def test_the_real_cpu_allocator_message_is_the_one_matched():
    text = str(_real_cpu_allocator_error())
    assert "DefaultCPUAllocator: can't allocate memory" in text and mentions_oom(text)


@pytest.mark.parametrize("name", FAILED)
def test_other_faults_are_failures_with_their_first_line(name):
    make, line = FAILED[name]
    exc = make()
    assert not is_oom(exc)
    assert failure_line(exc) == line


def test_a_crash_log_with_a_cuda_fault_is_failed_and_says_it(tmp_path):
    tail = (
        f"Traceback (most recent call last):\n  ...\ntorch.AcceleratorError: {ILLEGAL}Aborted (core dumped)"
    )
    assert not mentions_oom(tail)
    m = collect(tmp_path, returncode=-6, timed_out=None, wall_seconds=1.0, log_tail=tail)
    assert m.outcome is Outcome.FAILED
    assert m.error.endswith(
        "the log says: torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    )


@pytest.mark.parametrize(
    "tail",
    [
        f"Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: {CUDA_OOM}\n",
        "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\nAborted",
    ],
)
def test_a_crash_log_with_an_allocator_failure_is_oom(tail, tmp_path):
    m = collect(tmp_path, returncode=-6, timed_out=None, wall_seconds=1.0, log_tail=tail)
    assert m.outcome is Outcome.OOM


def test_last_error_line():
    assert last_error_line("a\nValueError: x\nRuntimeError: y\nbye") == "RuntimeError: y"
    assert last_error_line("all fine\n") is None
