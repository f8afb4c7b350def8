"""Measure the node: a device's achievable matrix-multiply rate, copy bandwidth and allocatable
memory, and the bus bandwidth of all-reduce and all-gather between its devices (gloo on the CPU,
NCCL on GPUs), with real torch in child processes, one per rank. See ``docs/doctor.md``.

Bus bandwidth follows nccl-tests' convention (``doc/PERFORMANCE.md`` there): for ``n`` ranks,
all-reduce ``busbw = algbw * 2(n-1)/n`` and all-gather ``busbw = algbw * (n-1)/n``, where
``algbw`` is the collective's size (all-gather: the gathered output) over its time, the slowest
rank's, the median of a few repeats.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CPU_PROCESSES",
    "allgather_busbw",
    "allreduce_busbw",
    "collective_figures",
    "run_rank",
    "measure_node",
    "summarize_ranks",
]

GIB = 2**30
CPU_PROCESSES = 2
"""Ranks of the collectives on the CPU (gloo): two processes, as a CPU study's trials run."""
REPEATS = 5
"""Timed repeats of each measurement (after one untimed warm-up); the median is reported."""
SIZES: dict[str, dict[str, Any]] = {
    # matmul: the CPU trains in float32 (explorer.worker._train.measure_cpu_matmul_flops), CUDA in bf16
    "cpu": {
        "matmul": 512,
        "matmul_iters": 4,
        "dtype": "float32",
        "collective": 16 * 2**20,
        "copy": 64 * 2**20,
    },
    "cuda": {"matmul": 8192, "matmul_iters": 20, "dtype": "bfloat16", "collective": 256 * 2**20, "copy": GIB},
}
"""Per device kind: the matrix side and dtype, the bytes of each collective and of the copy."""
CPU_PROBE_BYTES = 256 * 2**20
"""The real allocation (pages touched) that checks the CPU's allocatable figure, bounded: the
figure itself is the kernel's (``MemAvailable``, cgroup, ``RLIMIT_AS``), not an allocation of it."""
CUDA_PROBE_CHUNKS = (GIB, 64 * 2**20)
"""A GPU's allocatable memory is allocated for real, in chunks of these sizes until it fails."""


def allreduce_busbw(algbw: float, n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: ``algbw * 2(n-1)/n``."""
    return algbw * 2 * (n - 1) / n


def allgather_busbw(algbw: float, n: int) -> float:
    """nccl-tests' all-gather bus bandwidth: ``algbw * (n-1)/n``."""
    return algbw * (n - 1) / n


def _median_seconds(run: Callable[[], None], sync: Callable[[], None], repeats: int) -> list[float]:
    """The wall seconds of ``repeats`` calls of ``run`` (each ended by ``sync``), after a warm-up."""
    run()
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def _collectives(
    torch: Any, dev: Any, world: int, size: int, sync: Callable[[], None]
) -> dict[str, list[float]]:
    """This rank's seconds of each repeat of an all-reduce of ``size`` bytes and of an all-gather
    whose output is ``size`` bytes (a barrier before each, so every rank starts together)."""
    import torch.distributed as dist

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    count = size // dtype.itemsize // world * world
    flat = torch.ones(count, dtype=dtype, device=dev)
    shard = torch.ones(count // world, dtype=dtype, device=dev)
    out: dict[str, list[float]] = {"allreduce": [], "allgather": []}
    ops = {
        "allreduce": lambda: dist.all_reduce(flat),
        "allgather": lambda: dist.all_gather_into_tensor(flat, shard),
    }
    for name, op in ops.items():
        op()
        sync()
        for _ in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            sync()
            out[name].append(time.perf_counter() - t0)
    return out


def _matmul_tflops(torch: Any, dev: Any, sizes: Mapping[str, Any], sync: Callable[[], None]) -> list[float]:
    """TFLOP/s of each repeat of ``matmul_iters`` square matrix products in the device's dtype."""
    n, iters = sizes["matmul"], sizes["matmul_iters"]
    a = torch.randn(n, n, device=dev).to(getattr(torch, sizes["dtype"]))
    b = torch.randn(n, n, device=dev).to(a.dtype)

    def run() -> None:
        for _ in range(iters):
            torch.mm(a, b)

    return [2.0 * n**3 * iters / s / 1e12 for s in _median_seconds(run, sync, REPEATS)]


def _copy_tbs(torch: Any, dev: Any, size: int, sync: Callable[[], None]) -> list[float]:
    """TB/s of each repeat of copying ``size`` bytes (read and write: ``2 x size`` moved)."""
    src = torch.ones(size // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    return [2.0 * size / s / 1e12 for s in _median_seconds(lambda: dst.copy_(src), sync, REPEATS)]


def _cgroup_headroom() -> int | None:
    """Bytes the process's memory cgroup still allows (v2, else v1); ``None``: no limit."""
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            cap, used = Path(limit).read_text().strip(), Path(usage).read_text().strip()
        except OSError:
            continue
        if cap == "max" or int(cap) >= 2**60:
            return None
        return max(0, int(cap) - int(used))
    return None


def _cpu_memory(torch: Any) -> dict[str, Any]:
    """What this process can allocate on the CPU: the least of the kernel's available memory,
    the cgroup's headroom and ``RLIMIT_AS`` above the process's size, then a bounded real
    allocation (its pages touched) that checks it."""
    import psutil

    figures = {"available": psutil.virtual_memory().available, "cgroup": _cgroup_headroom()}
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        figures["rlimit_as"] = max(0, soft - psutil.Process().memory_info().vms)
    allocatable = min(v for v in figures.values() if v is not None)
    probe = min(CPU_PROBE_BYTES, allocatable // 2)
    block = torch.ones(probe // 4, dtype=torch.float32)  # every page written
    ok = bool(block[-1].item() == 1.0)
    del block
    limits = {k: round(v / GIB, 3) for k, v in figures.items() if v is not None}
    return {"allocatable": allocatable, "probe": probe if ok else 0, "limits_gib": limits}


def _cuda_memory(torch: Any, dev: Any) -> dict[str, Any]:
    """What this process can allocate on its GPU: allocated for real, chunk by chunk, until the
    allocator refuses (``torch.cuda.mem_get_info`` before, for comparison)."""
    torch.cuda.empty_cache()  # the measurements' cached blocks back to the driver first
    free, total = torch.cuda.mem_get_info(dev)
    held, allocated = [], 0
    for chunk in CUDA_PROBE_CHUNKS:
        while allocated + chunk <= total:
            try:
                held.append(torch.empty(chunk, dtype=torch.uint8, device=dev))
            except torch.OutOfMemoryError:
                break
            allocated += chunk
    del held
    torch.cuda.empty_cache()
    limits = {"mem_get_info_free": round(free / GIB, 3), "total": round(total / GIB, 3)}
    return {"allocatable": allocated, "probe": allocated, "limits_gib": limits}


def run_rank(
    rank: int,
    world: int,
    device: str,
    init_method: str | None,
    *,
    gpu: int | None = None,
    collectives_only: bool = False,
) -> dict[str, Any]:
    """One rank's measurements: the collectives (a process group of ``world`` ranks), then the
    matmul and the copy (every rank at once, as its device trains beside the others), then the
    memory (CUDA: each rank its GPU, ``gpu``, by default the rank; CPU: rank 0, the node's memory
    being one). ``collectives_only``: the collectives alone (between nodes)."""
    import datetime

    import torch

    cuda = device == "cuda"
    dev = torch.device("cuda", rank if gpu is None else gpu) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sizes = SIZES[device]
    out: dict[str, Any] = {"rank": rank, "threads": torch.get_num_threads()}
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
        out.update(_collectives(torch, dev, world, sizes["collective"], sync))
        dist.barrier()
    if collectives_only:
        if world > 1:
            dist.destroy_process_group()
        return out
    out["matmul_tflops"] = _matmul_tflops(torch, dev, sizes, sync)
    out["copy_tbs"] = _copy_tbs(torch, dev, sizes["copy"], sync)
    if world > 1:
        dist.barrier()
    if cuda or rank == 0:
        out["memory"] = _cuda_memory(torch, dev) if cuda else _cpu_memory(torch)
    if world > 1:
        dist.destroy_process_group()
    return out


def summarize_ranks(ranks: Sequence[Mapping[str, Any]], *, device: str, size: int) -> dict[str, Any]:
    """The node's figures from every rank's measurements: the slowest device's median matmul
    rate and copy bandwidth, the least allocatable memory, and each collective's time as the
    slowest rank's in each repeat (the median of those), as nccl-tests' algbw and busbw (GB/s)."""
    n = len(ranks)
    memory = [r["memory"] for r in ranks if "memory" in r]
    least = min(memory, key=lambda m: m["allocatable"])
    figures: dict[str, Any] = {
        "device": device,
        "processes": n,
        "backend": None if n < 2 else "nccl" if device == "cuda" else "gloo",
        "threads_per_process": ranks[0]["threads"],
        "matmul_dtype": SIZES[device]["dtype"],
        "matmul_size": SIZES[device]["matmul"],
        "matmul_tflops": min(statistics.median(r["matmul_tflops"]) for r in ranks),
        "memory_bandwidth_tbs": min(statistics.median(r["copy_tbs"]) for r in ranks),
        "allocatable_gib": least["allocatable"] / GIB,
        "allocation_probe_gib": least["probe"] / GIB,
        "memory_limits_gib": least["limits_gib"],
        "repeats": REPEATS,
    }
    return figures | collective_figures(ranks, size=size)


def collective_figures(ranks: Sequence[Mapping[str, Any]], *, size: int) -> dict[str, Any]:
    """Each collective's algbw and busbw (GB/s) from the ranks' times: in each repeat the slowest
    rank's, the median of those (``None``: one rank, no collective)."""
    n = len(ranks)
    figures: dict[str, Any] = {"collective_bytes": size if n > 1 else None}
    for name, busbw in (("allreduce", allreduce_busbw), ("allgather", allgather_busbw)):
        if n < 2:
            figures[f"{name}_algbw_gbs"] = figures[f"{name}_busbw_gbs"] = None
            continue
        seconds = statistics.median(max(r[name][i] for r in ranks) for i in range(REPEATS))
        algbw = size / seconds / 1e9
        figures[f"{name}_algbw_gbs"] = algbw
        figures[f"{name}_busbw_gbs"] = busbw(algbw, n)
    return figures


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _threads(processes: int) -> int:
    """Threads per rank on the CPU: the node's cores shared by the ranks, as the trials' are."""
    return max(1, (os.cpu_count() or 1) // processes)


def measure_node(
    device: str,
    processes: int,
    *,
    env: Mapping[str, str],
    timeout_s: float = 180.0,
    between: tuple[dict[str, Any] | None, str] = (None, "not measured: one node"),
) -> dict[str, Any]:
    """The node's figures (:func:`summarize_ranks`), measured by ``processes`` fresh interpreters
    (ranks of one process group where there are several) with environment ``env``, killed after
    ``timeout_s``; ``inter_node`` and ``inter_node_why`` are ``between``
    (:func:`explorer.doctor._between.measure_between_nodes`'s answer).

    Raises:
        RuntimeError: a rank failed or ran out of time (its last line of output).
    """
    started = time.monotonic()
    init = f"tcp://127.0.0.1:{_free_port()}"
    rank_env = dict(env)
    if device == "cpu":
        threads = str(_threads(processes))
        rank_env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    with tempfile.TemporaryDirectory(prefix="explorer-node-") as tmp:
        procs = []
        for rank in range(processes):
            cmd = [
                sys.executable,
                "-m",
                "explorer.doctor._node",
                "--rank",
                str(rank),
                "--world",
                str(processes),
            ]
            cmd += ["--device", device, "--init", init, "--out", str(Path(tmp) / f"rank-{rank}.json")]
            log = open(Path(tmp) / f"rank-{rank}.log", "w")  # noqa: SIM115 - closed with the process
            procs.append((subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT), log))
        failed = _wait(procs, started + timeout_s)
        for _, log in procs:
            log.close()
        if failed is not None:
            text = (Path(tmp) / f"rank-{failed[0]}.log").read_text().strip().splitlines()
            raise RuntimeError(
                f"the node measurement's rank {failed[0]} {failed[1]}: {text[-1] if text else ''}"
            )
        ranks = [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in range(processes)]
    figures = summarize_ranks(ranks, device=device, size=SIZES[device]["collective"])
    figures.update(inter_node=between[0], inter_node_why=between[1])
    figures["seconds"] = time.monotonic() - started
    return figures


def _wait(procs: list[tuple[subprocess.Popen[bytes], Any]], deadline: float) -> tuple[int, str] | None:
    """Wait for every rank; at the first failure or the deadline kill the rest (these processes
    only). ``None``: all exited 0; else the rank and what happened to it."""
    failed: tuple[int, str] | None = None
    pending = dict(enumerate(p for p, _ in procs))
    while pending and failed is None:
        for rank, proc in list(pending.items()):
            code = proc.poll()
            if code is None:
                continue
            del pending[rank]
            if code != 0:
                failed = (rank, f"exited {code}")
        if pending and failed is None and time.monotonic() > deadline:
            failed = (min(pending), "ran out of time")
        time.sleep(0.02)
    for proc in pending.values():
        proc.kill()
        proc.wait()
    return failed


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m explorer.doctor._node")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--device", choices=sorted(SIZES), required=True)
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True, type=Path)
    ns = parser.parse_args(argv)
    ns.out.write_text(json.dumps(run_rank(ns.rank, ns.world, ns.device, ns.init)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
