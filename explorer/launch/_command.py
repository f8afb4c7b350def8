"""The command line and environment that start the processes of one trial."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

from explorer.job import TrialJob

__all__ = [
    "Rendezvous",
    "free_port",
    "rank_environments",
    "trial_command",
    "trial_environment",
    "worker_argv",
    "zygote_environment",
]

# Only these variables reach the training processes (plus their prefixes below): nothing else of
# the driver's environment (cloud keys, database passwords, a storage URL) does. HF_TOKEN passes on
# purpose: a gated model (``path:`` a hub id) cannot be downloaded without it. explorer's own
# variables (EXPLORER_OWNER_PID, EXPLORER_TRIAL_TOKEN) are set by the launcher for each trial,
# never passed through, so an EXPLORER_* secret of the driver (EXPLORER_STORAGE_PASSWORD) stays.
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
_PASS_PREFIXES = ("NCCL_", "TORCH_")


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of a multi-node trial meet (torchrun's static rendezvous).

    The node of ``node_rank`` 0 hosts the store at ``master_addr:master_port``; global rank 0 (the
    one that writes ``result.json``) is its first process.
    """

    master_addr: str
    master_port: int
    node_rank: int
    nnodes: int


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for the rendezvous of one trial; ``""``: every address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def trial_environment(job: TrialJob, *, cpu_count: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment for the training processes of ``job`` on one node."""
    per_node = max(1, job.config.number_gpus // max(1, job.config.number_nodes))
    per_process = job.resources.cpus_per_trial_process or max(1, cpu_count // per_node)
    return _environment(per_process, base)


def zygote_environment(*, cpu_count: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The warm-start zygote's environment: a trial's, with every core (ranks set their own threads),
    and ``torch.cuda.is_available()`` answered by NVML: an import that asks it (accelerate and
    transformers do) then leaves CUDA alone, and the zygote's forked ranks can still use it."""
    return {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", **_environment(cpu_count, base)}


def rank_environments(
    env: dict[str, str], *, world_size: int, port: int, process_group: bool = True
) -> list[dict[str, str]]:
    """What torchrun gives each rank of a one-node job (rank 0 hosts the rendezvous store).

    One process without ``process_group`` gets none of it (a plain 1-GPU trial); one process with
    it (FSDP on one GPU: :attr:`TrialConfig.process_group`) gets a world of size 1.
    """
    if world_size == 1 and not process_group:
        return [dict(env)]
    common = dict(
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        GROUP_WORLD_SIZE="1",
        ROLE_NAME="default",
        ROLE_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="False",
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
    )
    return [
        {**env, **common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)}
        for r in range(world_size)
    ]


def _environment(per_process: int, base: dict[str, str] | None) -> dict[str, str]:
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in _PASS_THROUGH or k.startswith(_PASS_PREFIXES)}
    env.update(
        OMP_NUM_THREADS=str(per_process),
        MKL_NUM_THREADS=str(per_process),
        MALLOC_ARENA_MAX="2",  # keeps glibc arenas from inflating the address space under RLIMIT_AS
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
    )
    return env


def worker_argv(job: TrialJob, *, out_dir: str) -> list[str]:
    """The arguments of ``python -m explorer.worker`` for one rank of ``job``."""
    return ["--job", job.to_json(), "--out", out_dir]


def trial_command(
    job: TrialJob, *, runner: str, out_dir: str, port: int, rendezvous: Rendezvous | None = None
) -> list[str]:
    """``python -m explorer.worker`` for one GPU, else under torchrun or accelerate launch.

    A trial of one process in a process group (FSDP on one GPU: accelerate wraps a model in FSDP
    only when torchrun's variables say there is a group) runs under torchrun with one process:
    ``accelerate launch`` refuses ``--multi_gpu`` with fewer than 2.

    Without ``rendezvous`` the trial runs on this node alone (its store on 127.0.0.1:``port``);
    with one, this node starts its ``number_gpus / number_nodes`` processes as node
    ``rendezvous.node_rank`` of the trial.

    Raises:
        ValueError: a multi-node trial without a rendezvous, or a rendezvous for another node count.
    """
    worker = ["-m", "explorer.worker", *worker_argv(job, out_dir=out_dir)]
    n = job.config.number_gpus
    nodes = job.config.number_nodes
    if rendezvous is None and nodes != 1:
        raise ValueError(f"a trial on {nodes} nodes needs a rendezvous")
    if rendezvous is not None and rendezvous.nnodes != nodes:
        raise ValueError(f"a rendezvous of {rendezvous.nnodes} nodes for a trial on {nodes}")
    if n == 1 and nodes == 1 and not job.config.process_group:
        return [sys.executable, *worker]
    addr, master_port = (
        (rendezvous.master_addr, rendezvous.master_port) if rendezvous else ("127.0.0.1", port)
    )
    node_rank = rendezvous.node_rank if rendezvous else 0
    if runner == "accelerate" and n > 1:
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--num_processes",
            str(n),  # all machines together
            "--num_machines",
            str(nodes),
            "--machine_rank",
            str(node_rank),
            "--main_process_ip",
            addr,
            "--main_process_port",
            str(master_port),
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
        str(nodes),
        "--node_rank",
        str(node_rank),
        "--nproc_per_node",
        str(n // nodes),
        "--master_addr",
        addr,
        "--master_port",
        str(master_port),
        *worker,
    ]
