"""Compiled trials (the ``torch_compile`` knob): how to compile, what was trained, where it compiled.

transformers hands ``torch_compile`` to accelerate, which wraps the model as trained (the plain
model, DDP or FSDP1; under FSDP2, the model before it is sharded) in ``torch.compile``: an
``OptimizedModule``. dynamo compiles lazily, in the first forward (AOTAutograd the backward in the
first backward), and again whenever a guard fails: a new input shape, for one.

Shapes: ``max_length`` batches all have one shape, so the default (static shapes first) compiles
once. ``longest`` and ``packed`` batches change their sequence length from step to step: with the
default, step 1 compiles for its exact shape and step 2 recompiles with a dynamic length (a tiny
granite on the CPU: 27 s, then 29.8 s more in the first measured step). Those trials compile with
``dynamic=True`` from the first step (accelerate's ``ACCELERATE_DYNAMO_USE_DYNAMIC``): one compile.

Whatever still compiles (a guard nobody foresaw) stays out of the measured window: the step clock
counts dynamo's graphs at every step end, and the warmup grows past the last step that compiled
(:func:`explorer.worker._stopping.warmup_at_least`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from explorer.trial_config import TrialConfig

__all__ = [
    "CompilePlan",
    "compile_count",
    "compile_plan",
    "compile_record",
    "compiling_steps",
    "is_compiled",
    "trained_model",
    "unwrap_compiled",
]

DYNAMIC_ENV = "ACCELERATE_DYNAMO_USE_DYNAMIC"
"""accelerate's switch for ``torch.compile(dynamic=True)`` (read when the Trainer is created)."""


@dataclass(frozen=True)
class CompilePlan:
    """How a compiled trial compiles."""

    dynamic: bool
    """``torch.compile(dynamic=True)`` from the first step (batches that change shape)."""


def compile_plan(config: TrialConfig) -> CompilePlan | None:
    """``None`` for a trial that does not compile. Else its plan, put in force for the Trainer about
    to be created (accelerate reads it then): dynamic shapes where batches change shape (``longest``,
    ``packed``); dynamo's default (static first) for ``max_length``."""
    dynamic = config.compiles_dynamic
    if dynamic:
        os.environ[DYNAMIC_ENV] = "1"
    else:
        os.environ.pop(DYNAMIC_ENV, None)
    return CompilePlan(dynamic=dynamic) if config.torch_compile else None


def _optimized(module: Any) -> bool:
    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def unwrap_compiled(module: Any) -> Any:
    """``module`` without torch.compile's ``OptimizedModule`` wrapper (``module`` if it has none)."""
    return module._orig_mod if _optimized(module) else module


def trained_model(trainer: Any) -> Any:
    """The model as the Trainer trains it (DDP, FSDP, ... or the model itself), compile wrapper peeled.

    Never ``trainer.model_wrapped or trainer.model``: the truth value of an ``OptimizedModule`` is
    its ``len()``, which raises ``TypeError: <Model> does not support len()`` (issue 15).
    """
    wrapped = getattr(trainer, "model_wrapped", None)
    return unwrap_compiled(wrapped if wrapped is not None else trainer.model)


def is_compiled(trainer: Any) -> bool:
    """Whether the Trainer trained a ``torch.compile``-d model (the outer wrapper, or under FSDP
    the Trainer's model, is an ``OptimizedModule``)."""
    wrapped = getattr(trainer, "model_wrapped", None)
    return _optimized(wrapped) or _optimized(trainer.model)


def compile_count() -> int:
    """Graphs dynamo has compiled in this process so far (a recompile is one more)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def compiling_steps(counts: list[int]) -> list[int]:
    """The steps (1-based) in which dynamo compiled, from the graphs compiled since training
    started, read at the end of each step."""
    return [i + 1 for i, n in enumerate(counts) if n > (counts[i - 1] if i else 0)]


def compile_record(trainer: Any, counts: list[int], plan: CompilePlan) -> dict[str, Any]:
    """What a compiled trial's measurement records: whether the model trained was compiled, the
    graphs dynamo compiled, the steps that compiled (all in the warmup), graph breaks, and whether
    shapes were dynamic from the start."""
    breaks = torch._dynamo.utils.counters["graph_break"]
    return {
        "compiled": is_compiled(trainer),
        "graphs": counts[-1] if counts else 0,
        "compiling_steps": compiling_steps(counts),
        "graph_breaks": int(sum(breaks.values())),
        "dynamic": plan.dynamic,
    }
