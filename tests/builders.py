"""Plain builders shared by tests: a made-up Properties, a TrialConfig with overrides, the real
CLI run to its end or running, a running ``explorer dashboard``, the most GPU slots held at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from explorer.measurement import Properties
from explorer.trial_config import TrialConfig
from tests.conftest import TINY_ARCH


def properties(value: float, **overrides: Any) -> Properties:
    """Properties of a feasible made-up trial whose objective is ``value``."""
    fields: dict[str, Any] = dict(
        dataset_tokens_per_second=2 * value,
        dataset_tokens_per_second_per_gpu=value,
        train_tokens_per_second=3 * value,
        train_runtime=1.5,
        train_samples_per_second=4.0,
        train_steps_per_second=2.0,
        peak_memory_gib=0.25,
        peak_memory_allocated_gib=0.2,
        measured_steps=3,
        warmup_steps=1,
        measured_seconds=1.5,
        warmup_seconds=0.5,
        step_time_mean=0.5,
        step_time_cv=0.01,
        step_time_rel_ci=None,
        stop_reason="steps",
        model_flops_per_token=1e6,
        peak_flops=1e11,
        mfu=0.1,
        hfu=0.12,
        system={"cpu_compute_utilization": 50.0},
        measured_dataset_tokens=100,
        measured_train_tokens=120,
        measured_samples=8,
        device="cpu",
    )
    return Properties(**(fields | overrides))


def config(base: dict[str, Any], **overrides: Any) -> TrialConfig:
    """``TrialConfig(**base)`` with ``overrides``."""
    return TrialConfig(**(base | overrides))


GRANITE_FSDP2 = dict(
    batch_size=32,
    number_gpus=4,
    distributed_backend="FSDP",
    fsdp_version=2,
    fsdp_sharding_strategy="SHARD_GRAD_OP",
    gradient_checkpointing=True,
    model_max_length=2048,
)
"""A configuration of the granite benchmark space (4 GPUs, per-device batch 8), for ``config``."""


TINY_GRANITE = {**TINY_ARCH, "model_type": "granite"}
"""The tiny llama's shape as a granite (the model of issue 15), for ``workload.model.architecture``."""

CUDA_ONE_GPU: dict[str, Any] = {
    "resources": {"device": "cuda", "gpu_model": None, "device_memory_gib": None, "gpus_per_node": 1},
    "search_space": {
        "parameters": {
            "batch_size": {"values": [4, 8]},
            "number_gpus": {"values": [1]},
            "gradient_checkpointing": {"choices": [False, True]},
        }
    },
}
"""The study patch of ``pytest -m gpu`` on one GPU: the model read from the device (NVML, which
also sizes the node to its GPUs), and a space that one GPU can run."""


REPO = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m explorer ARGS`` from the repository root (so printed file names are relative),
    its output captured; ``env`` is added to this process's environment."""
    import os

    return subprocess.run(
        [sys.executable, "-m", "explorer", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start_cli(*args: str, new_session: bool = False) -> subprocess.Popen[str]:
    """``python -m explorer ARGS`` from the repository root, running: stdout and stderr merged into
    one unbuffered text pipe; ``new_session``: as its own process group (to signal the group)."""
    import os

    return subprocess.Popen(
        [sys.executable, "-m", "explorer", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=new_session,
    )


def start_dashboard(study_file: Path, port: int) -> subprocess.Popen[str]:
    """``explorer dashboard STUDY --port PORT`` (the real CLI; its first stdout line is its URL)."""
    return subprocess.Popen(
        [sys.executable, "-m", "explorer", "dashboard", str(study_file), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def peak_held(slots: Iterable[Any], weight: Callable[[Any], int] = lambda slot: 1) -> int:
    """The most ``weight`` held at one instant by slots with ``start``/``end`` (a slot holds
    [start, end): an end frees before a start at the same time)."""
    items = list(slots)
    events = sorted([(s.start, 1, weight(s)) for s in items] + [(s.end, 0, -weight(s)) for s in items])
    held = peak = 0
    for _, _, delta in events:
        held += delta
        peak = max(peak, held)
    return peak


PLAN_TABLE = "benchmarks/results/tables/cpu-two-models.csv"
"""Real CPU trials of two declared GPU models (``benchmarks/plan_cpu.py``)."""
PLAN_STUDIES = (
    "benchmarks/plan_studies/replay-cpu-small.yaml",
    "benchmarks/plan_studies/replay-cpu-large.yaml",
)
"""The replay studies of :data:`PLAN_TABLE`, one per GPU model."""


def replayed_plan_studies(root: Path) -> list[Path]:
    """The two replay studies of ``explorer plan``'s worked example, copied under ``root`` with
    their table and space, each run to the end with ``explorer optimize``."""
    from explorer.cli import main

    repo = Path(__file__).resolve().parent.parent
    for rel in (PLAN_TABLE, "search_spaces/plan-cpu.yaml", *PLAN_STUDIES):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((repo / rel).read_bytes())
    files = [root / rel for rel in PLAN_STUDIES]
    for file in files:
        assert main(["optimize", str(file)]) == 0
    return files


def best_rates_by_hand(
    table: Path, *, batch_size: int | None = None
) -> dict[tuple[str, int], tuple[float, dict[str, str]]]:
    """Each (GPU model, GPU count)'s best dataset tokens/s per GPU, from the raw window
    measurements (``measured_dataset_tokens / measured_seconds / number_gpus``) of a table's
    measured rows (of that global ``batch_size`` only, if given), with the row."""
    import csv

    best: dict[tuple[str, int], tuple[float, dict[str, str]]] = {}
    with table.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["status"] != "ok" or row.get("reused_from"):
                continue
            if (
                batch_size is not None
                and int(row["batch_size"]) * int(row["gradient_accumulation_steps"]) != batch_size
            ):
                continue
            n = int(row["number_gpus"])
            per_gpu = float(row["measured_dataset_tokens"]) / float(row["measured_seconds"]) / n
            key = (row["gpu_model"], n)
            if per_gpu > best.get(key, (0.0, {}))[0]:
                best[key] = (per_gpu, row)
    return best
