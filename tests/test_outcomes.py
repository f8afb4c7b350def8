"""Classification of how a trial ended: OOM texts (CUDA and CPU), and the launcher's collection rules."""

from __future__ import annotations

import json

import pytest
import torch

from explorer.launch import collect
from explorer.measurement import Outcome
from explorer.oom import mentions_oom
from explorer.worker._memory import is_oom


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"),
        MemoryError(),
    ],
)
def test_oom_errors(exc):
    assert is_oom(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("NCCL error: unhandled system error"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        ValueError("bad optim"),
        KeyError("x"),
    ],
)
def test_other_errors_are_not_oom(exc):
    assert not is_oom(exc)


def _write(d, name, **data):
    (d / name).write_text(json.dumps(data))


def test_any_rank_oom_wins_over_the_others_failing(tmp_path):
    _write(tmp_path, "error-rank0.json", outcome="failed", error="Connection closed by peer", rank=0)
    _write(tmp_path, "error-rank1.json", outcome="oom", error="can't allocate memory", rank=1)
    m = collect(tmp_path, returncode=1, timed_out=None, wall_seconds=3.0, log_tail="")
    assert m.outcome is Outcome.OOM and m.error.startswith("rank 1:")


def test_timeout_and_silent_crash_are_failed(tmp_path):
    m = collect(tmp_path, returncode=-9, timed_out=30.0, wall_seconds=30.0, log_tail="")
    assert m.outcome is Outcome.FAILED and "timed out after 30 s" in m.error
    m = collect(tmp_path, returncode=-11, timed_out=None, wall_seconds=1.0, log_tail="Segmentation fault")
    assert m.outcome is Outcome.FAILED and "signal 11" in m.error


def test_crash_whose_log_says_oom_is_oom(tmp_path):
    tail = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nAborted"
    assert mentions_oom(tail)
    m = collect(tmp_path, returncode=-6, timed_out=None, wall_seconds=1.0, log_tail=tail)
    assert m.outcome is Outcome.OOM
