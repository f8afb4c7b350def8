"""The objectives a study may optimize, each declared once: its name, direction, place and meaning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

__all__ = [
    "OBJECTIVE",
    "OBJECTIVE_TABLE",
    "OBJECTIVES",
    "NEEDS_SETTINGS",
    "PER_GPU_RANKED",
    "SECOND_OBJECTIVES",
    "Direction",
    "FirstObjective",
    "Objective",
    "SecondObjective",
]

Direction = Literal["minimize", "maximize"]


@dataclass(frozen=True)
class Objective:
    """One objective: an Optuna metric name, the way it is optimized, and where it may stand."""

    name: str
    """The study file's value and the study's Optuna metric name."""
    direction: Direction
    first: bool
    """Whether ``objective`` may name it."""
    second: bool
    """Whether ``second_objective`` may name it."""
    doc: str
    """What it is, for the docs (Markdown)."""
    needs: Literal["prices", "budget"] | None = None
    """The study-file section its value is computed with (``None``: the trial's measurement alone)."""
    per_gpu_ranked: bool = False
    """Ranks one GPU model's configurations as the per-GPU rate does (a price per GPU-hour only
    scales it), so the throughput prior and the frontier walk, which reason about the per-GPU
    rate, still point the right way."""


OBJECTIVE_TABLE: tuple[Objective, ...] = (
    Objective(
        "dataset_tokens_per_second_per_gpu",
        "maximize",
        first=True,
        second=False,
        doc="dataset tokens per second per GPU, the seeds' metric (the default); it favours the fewest GPUs",
        per_gpu_ranked=True,
    ),
    Objective(
        "dataset_tokens_per_second",
        "maximize",
        first=True,
        second=True,
        doc="the whole trial's dataset tokens per second, all GPUs together: the fastest trial",
    ),
    Objective(
        "tokens_per_dollar",
        "maximize",
        first=True,
        second=True,
        doc="dataset tokens per USD, `3600 * per-GPU rate / price`, at the study's `prices` for the "
        "trial's GPU model",
        needs="prices",
        per_gpu_ranked=True,
    ),
    Objective(
        "hours_for_budget",
        "minimize",
        first=True,
        second=True,
        doc="wall-clock hours to process the study's `budget` (tokens times epochs) at the trial's "
        "total rate, within the space's `number_gpus`",
        needs="budget",
    ),
    Objective(
        "number_gpus",
        "minimize",
        first=False,
        second=True,
        doc="the trial's GPUs: charts throughput against GPU count",
    ),
    Objective(
        "peak_memory_gib",
        "minimize",
        first=False,
        second=True,
        doc="the trial's peak device memory, GiB",
    ),
)
"""Every objective, in the order the docs list them."""

OBJECTIVE = OBJECTIVE_TABLE[0].name
"""The default objective (the seeds' metric), also the first objective of a study stored before
objectives could be chosen."""
OBJECTIVES: dict[str, Direction] = {o.name: o.direction for o in OBJECTIVE_TABLE if o.first}
"""The first objectives a study file may choose, and their directions."""
SECOND_OBJECTIVES: dict[str, Direction] = {o.name: o.direction for o in OBJECTIVE_TABLE if o.second}
"""The second objectives a study file may ask for, and their directions."""
NEEDS_SETTINGS = frozenset(o.name for o in OBJECTIVE_TABLE if o.needs)
"""Objectives computed with the study's prices or budget (``objective_settings``), not the trial alone."""
PER_GPU_RANKED = frozenset(o.name for o in OBJECTIVE_TABLE if o.per_gpu_ranked)
"""First objectives that rank configurations as the per-GPU rate does (:attr:`Objective.per_gpu_ranked`)."""

if TYPE_CHECKING:
    FirstObjective = str
    SecondObjective = str
else:  # the study file's types, built from the table (a Literal: pydantic lists the values it takes)
    FirstObjective = Literal[tuple(OBJECTIVES)]
    SecondObjective = Literal[tuple(SECOND_OBJECTIVES)]
