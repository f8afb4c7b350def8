"""Measure the collectives between two nodes of the study's Ray cluster: one rank a node, each a
Ray task pinned to its node, the same all-reduce and all-gather as within a node
(:func:`explorer.doctor._node.run_rank`), gloo on the CPU and NCCL between GPUs."""

from __future__ import annotations

import os
import time
from typing import Any

from explorer.doctor._node import SIZES, collective_figures, run_rank

__all__ = ["ONE_NODE", "measure_between_nodes"]

ONE_NODE = "not measured: one node"


def _nodes(device: str) -> list[dict[str, Any]]:
    """The cluster's alive nodes that can hold a rank (with a GPU, for CUDA)."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    if device == "cuda":
        alive = [n for n in alive if n.get("Resources", {}).get("GPU", 0) >= 1]
    return alive


def _free_port(host: str) -> int:
    """A TCP port free on ``host`` (run on the node that hosts the rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _rank(rank: int, device: str, init: str) -> dict[str, Any]:
    """One rank of two (a Ray task on its node: its one GPU is device 0), the collectives alone."""
    return run_rank(rank, 2, device, init, gpu=0, collectives_only=True)


def _between(address: str, device: str, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    pair = _nodes(device)[:2]
    if len(pair) < 2:
        return None, ONE_NODE

    def on(node: dict[str, Any]) -> dict[str, Any]:
        pinned = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        return {"scheduling_strategy": pinned, "num_cpus": 1, "num_gpus": 1 if device == "cuda" else 0}

    host = pair[0]["NodeManagerAddress"]
    port = ray.get(ray.remote(_free_port).options(**on(pair[0])).remote(host), timeout=timeout_s)
    init = f"tcp://{host}:{port}"
    task = ray.remote(_rank)
    refs = [task.options(**on(n)).remote(r, device, init) for r, n in enumerate(pair)]
    ranks = ray.get(refs, timeout=timeout_s)
    figures = collective_figures(ranks, size=SIZES[device]["collective"])
    figures.update(backend="nccl" if device == "cuda" else "gloo", processes=2)
    figures["nodes"] = [f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in pair]
    return figures, f"measured between nodes {figures['nodes'][0]} and {figures['nodes'][1]}, one rank each"


def measure_between_nodes(
    address: str | None, device: str, *, timeout_s: float = 180.0
) -> tuple[dict[str, Any] | None, str]:
    """The bus bandwidth of all-reduce and all-gather between two nodes of the Ray cluster at
    ``address`` (``None``: ``RAY_ADDRESS``), with why: ``(None, "not measured: one node")``
    without a cluster (no address: a local Ray is one node) or with one node that can hold a rank;
    ``(None, "not measured: <the first line of the error>")`` where it failed."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None or address == "local":
        return None, ONE_NODE
    import ray

    started = not ray.is_initialized()
    t0 = time.monotonic()
    try:
        found, why = _between(address, device, timeout_s)
    except Exception as exc:  # a cluster that does not answer, a rank that fails: said, not raised
        text = str(exc).strip().splitlines()
        return None, f"not measured: {type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    finally:
        if started and ray.is_initialized():
            ray.shutdown()
    if found is not None:
        found["seconds"] = time.monotonic() - t0
    return found, why
