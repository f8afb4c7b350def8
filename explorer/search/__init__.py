"""The search strategy: what to try next, and what can be known without running it.

The sampler (TPE, GP, random), local search around the best configurations (the frontier walk,
neighbours ordered by the memory model and the throughput prior), and OOM inference by memory
dominance. Nothing here touches a storage: :mod:`explorer.study` asks it and records the answers.
"""

from explorer.search._frontier import frontier_probe, frontier_stopped
from explorer.search._inference import fits_by_dominance, inferred_oom, memory_dominates
from explorer.search._memory_model import MemoryModel
from explorer.search._neighbours import LocalSearch
from explorer.search._sampler import DEFAULT_STARTUP, make_sampler
from explorer.search._throughput_prior import Ceilings, throughput_dominates

__all__ = [
    "DEFAULT_STARTUP",
    "Ceilings",
    "LocalSearch",
    "MemoryModel",
    "fits_by_dominance",
    "frontier_probe",
    "frontier_stopped",
    "inferred_oom",
    "make_sampler",
    "memory_dominates",
    "throughput_dominates",
]
