"""The command line and environment that start the processes of one trial."""

from __future__ import annotations

import os
import socket
import sys

from explorer.job import TrialJob

__all__ = ["free_port", "trial_command", "trial_environment"]

# Only these variables reach the training processes (plus their prefixes below).
_PASS_THROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "LD_LIBRARY_PATH",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "TRANSFORMERS_OFFLINE",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
)
_PASS_PREFIXES = ("NCCL_", "TORCH_", "EXPLORER_")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the rendezvous of one trial)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def trial_environment(job: TrialJob, *, cpu_count: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment for the training processes of ``job``."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in _PASS_THROUGH or k.startswith(_PASS_PREFIXES)}
    per_process = job.resources.cpus_per_trial_process or max(1, cpu_count // job.config.number_gpus)
    env.update(
        OMP_NUM_THREADS=str(per_process),
        MKL_NUM_THREADS=str(per_process),
        MALLOC_ARENA_MAX="2",  # keeps glibc arenas from inflating the address space under RLIMIT_AS
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
    )
    return env


def trial_command(job: TrialJob, *, runner: str, out_dir: str, port: int) -> list[str]:
    """``python -m explorer.worker`` for one GPU, else under torchrun or accelerate launch."""
    worker = ["-m", "explorer.worker", "--job", job.to_json(), "--out", out_dir]
    n = job.config.number_gpus
    if n == 1 and job.config.number_nodes == 1:
        return [sys.executable, *worker]
    if runner == "accelerate":
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--num_processes",
            str(n),
            "--num_machines",
            "1",
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
            "--multi_gpu",  # accelerate's torchrun-style launcher; the worker picks the device
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            *worker,
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(n),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        *worker,
    ]
