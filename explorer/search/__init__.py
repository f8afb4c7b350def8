"""The search strategy: what to try next, and what can be known without running it.

Named strategies behind one contract (:class:`Strategy`, chosen by ``sampler.strategy``): local
search around the best configurations (the frontier walk, the joint models, neighbours ordered by
the memory model and the throughput prior) in front of an Optuna sampler (TPE, GP, random), or a
plain sampler; and OOM inference by memory dominance. Nothing here touches a storage:
:mod:`explorer.study` asks the strategy and records the answers.
"""

from explorer.search._frontier import frontier_probe, frontier_stopped
from explorer.search._inference import fits_by_dominance, inferred_oom, memory_dominates
from explorer.search._memory_model import MemoryModel
from explorer.search._neighbours import LocalSearch
from explorer.search._sampler import DEFAULT_STARTUP, make_sampler
from explorer.search._strategies import FRONTIER
from explorer.search._strategy import (
    EXPLORE_AFTER,
    STRATEGY_CLASSES,
    Proposal,
    Strategy,
    StudyState,
    make_strategy,
    register,
)
from explorer.search._throughput_prior import Ceilings, throughput_dominates

__all__ = [
    "DEFAULT_STARTUP",
    "EXPLORE_AFTER",
    "FRONTIER",
    "STRATEGY_CLASSES",
    "Ceilings",
    "LocalSearch",
    "MemoryModel",
    "Proposal",
    "Strategy",
    "StudyState",
    "fits_by_dominance",
    "frontier_probe",
    "frontier_stopped",
    "inferred_oom",
    "make_sampler",
    "make_strategy",
    "memory_dominates",
    "register",
    "throughput_dominates",
]
