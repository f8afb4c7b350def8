"""The ``sbatch`` line of the run ``explorer plan`` chose: its nodes, GPUs per node, and a time
limit from the predicted hours with a margin."""

from __future__ import annotations

import math
import shlex

from explorer.plan._job import PlanJob
from explorer.plan._rows import PlanRow

__all__ = [
    "TIME_MARGIN",
    "TIME_SETUP_MINUTES",
    "predicted_hours",
    "sbatch_command",
    "sbatch_lines",
    "time_limit",
    "time_limit_hours",
]

TIME_MARGIN = 0.2
"""The time limit's share over the predicted hours (the prediction's error, a slower node)."""
TIME_SETUP_MINUTES = 15
"""Minutes added for what the prediction leaves out: loading the model and data, compiling."""


def predicted_hours(row: PlanRow, job: PlanJob) -> float:
    """The run's predicted hours; an extrapolated row's: its band's slow end, where finite."""
    hours = row.hours(job)
    band = row.hours_band(job)
    return max(hours, band[1]) if band is not None and math.isfinite(band[1]) else hours


def time_limit_hours(row: PlanRow, job: PlanJob) -> float:
    """The hours to ask for: :func:`predicted_hours` plus :data:`TIME_MARGIN` and
    :data:`TIME_SETUP_MINUTES`."""
    return predicted_hours(row, job) * (1 + TIME_MARGIN) + TIME_SETUP_MINUTES / 60


def time_limit(hours: float) -> str:
    """``hours`` as Slurm's ``D-HH:MM:SS``, rounded up to the minute."""
    minutes = math.ceil(hours * 60 - 1e-9)
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def sbatch_command(row: PlanRow, job: PlanJob, *, torchrun: str, gpus: bool = True) -> str:
    """``sbatch --nodes N --ntasks-per-node 1 --gpus-per-node G --time T --wrap '...'`` running
    ``torchrun`` once a node through ``srun``: on several nodes each node's ``NODE_RANK`` is its
    ``SLURM_NODEID`` and ``MASTER_ADDR`` the allocation's first node. ``gpus=False`` (a study of
    CPU processes): no ``--gpus-per-node``."""
    nodes = int(row.config.number_nodes or 1)
    options = [f"--nodes={nodes}", "--ntasks-per-node=1"]
    if gpus:
        options.append(f"--gpus-per-node={row.number_gpus // nodes}")
    options.append(f"--time={time_limit(time_limit_hours(row, job))}")
    if nodes == 1:
        wrap = f"srun {torchrun}"
    else:
        per_node = f"export NODE_RANK=$SLURM_NODEID; exec {torchrun}"
        wrap = (
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1); '
            f"srun bash -c {shlex.quote(per_node)}"
        )
    return shlex.join(["sbatch", *options]) + f" --wrap={shlex.quote(wrap)}"


def sbatch_lines(row: PlanRow, job: PlanJob, *, torchrun: str, gpus: bool = True) -> list[str]:
    """What ``explorer plan`` prints for Slurm: :func:`sbatch_command` and where its time limit
    comes from."""
    predicted = f"{predicted_hours(row, job):,.2f} h predicted"
    return [
        sbatch_command(row, job, torchrun=torchrun, gpus=gpus),
        f"  (--time: {predicted} + {100 * TIME_MARGIN:g}% + {TIME_SETUP_MINUTES} min; the command is"
        " the check run above: put your fine-tune's in its place)",
    ]
