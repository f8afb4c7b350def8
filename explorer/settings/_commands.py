"""The ``torchrun`` and ``accelerate launch`` command lines that run a configuration: the check
run (``explorer.train_best``) and a user's script (``explorer.user_train`` or one's own)."""

from __future__ import annotations

import shlex
from pathlib import Path

from explorer.settings._training import fsdp_environment
from explorer.trial_config import TrialConfig

__all__ = [
    "MASTER_PORT",
    "NODE_VARIABLES",
    "accelerate_command",
    "nodes_note",
    "torchrun_command",
    "user_accelerate_command",
    "user_torchrun_command",
]


def _entry(job_file: Path, steps: int) -> str:
    return shlex.join(["-m", "explorer.train_best", "--job", str(job_file), "--steps", str(steps)])


MASTER_PORT = 29500
"""The rendezvous port of a multi-node run's node 0."""
NODE_VARIABLES = '--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port ' + str(MASTER_PORT)
"""A multi-node run's torchrun arguments that differ per node: run the command on every node with
``NODE_RANK`` (0 .. nodes - 1) and ``MASTER_ADDR`` (node 0's address) set."""


def nodes_note(config: TrialConfig) -> str | None:
    """How to start a run of several nodes (``None`` for one node)."""
    nodes = int(config.number_nodes or 1)
    if nodes == 1:
        return None
    return (
        f"{nodes} nodes of {config.number_gpus // nodes} GPUs: run the command on each node with NODE_RANK "
        f"(0 to {nodes - 1}) and MASTER_ADDR (node 0's address) set"
    )


def _torchrun(config: TrialConfig, entry: str) -> str:
    nodes = int(config.number_nodes or 1)
    per_node = str(config.number_gpus // nodes)
    if nodes == 1:
        return f"{shlex.join(['torchrun', '--standalone', '--nproc_per_node', per_node])} {entry}"
    head = shlex.join(["torchrun", "--nnodes", str(nodes), "--nproc_per_node", per_node])
    return f"{head} {NODE_VARIABLES} {entry}"


def _accelerate(config_file: Path, config: TrialConfig | None, entry: str) -> str:
    head = shlex.join(["accelerate", "launch", "--config_file", str(config_file)])
    if config is not None and int(config.number_nodes or 1) > 1:
        head += (
            f' --machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" --main_process_port {MASTER_PORT}'
        )
    return f"{head} {entry}"


def torchrun_command(config: TrialConfig, *, job_file: Path, steps: int) -> str:
    """``torchrun --standalone --nproc_per_node N -m explorer.train_best --job FILE --steps S``; on
    several nodes ``--nnodes K --nproc_per_node N/K`` and the per-node :data:`NODE_VARIABLES`.
    (The worker sets the environment FSDP1 needs itself.)"""
    return _torchrun(config, _entry(job_file, steps))


def accelerate_command(
    *, config_file: Path, job_file: Path, steps: int, config: TrialConfig | None = None
) -> str:
    """``accelerate launch --config_file FILE -m explorer.train_best --job FILE --steps S``; on
    several nodes (``config``) with each node's ``--machine_rank`` and node 0's address."""
    return _accelerate(config_file, config, _entry(job_file, steps))


def _user_entry(settings_dir: Path, trainer: str) -> str:
    return shlex.join(["-m", "explorer.user_train", "--settings", str(settings_dir), "--trainer", trainer])


def user_torchrun_command(config: TrialConfig, *, settings_dir: Path, trainer: str = "plain") -> str:
    """A user's script under ``torchrun`` (``explorer.user_train``, or one's own in its place),
    with the environment :func:`~explorer.settings.fsdp_environment` asks for before it: FSDP1's
    strategy reaches accelerate only that way."""
    env = " ".join(f"{k}={v}" for k, v in fsdp_environment(config).items())
    command = _torchrun(config, _user_entry(settings_dir, trainer))
    return f"{env} {command}" if env else command


def user_accelerate_command(
    config: TrialConfig, *, config_file: Path, settings_dir: Path, trainer: str = "plain"
) -> str:
    """A user's script under ``accelerate launch --config_file accelerate.yaml`` (accelerate sets
    FSDP1's strategy from the config)."""
    return _accelerate(config_file, config, _user_entry(settings_dir, trainer))
