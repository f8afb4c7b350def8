"""Device memory: the per-process cap, the peak, and what counts as out-of-memory.

The CUDA branches are complete code that has never run in this project's CI (no GPU here).
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import torch

from explorer.oom import is_oom_error

__all__ = [
    "MemoryCap",
    "check_within_limit",
    "is_oom",
    "memory_figures",
    "memory_limit_bytes",
    "peak_memory_bytes",
    "peak_rss_bytes",
    "reset_peak_rss",
]


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means the configuration does not fit in memory (:mod:`explorer.oom`)."""
    return is_oom_error(exc)


def _vm_size() -> int:
    """This process's address-space size (what ``RLIMIT_AS`` limits), from psutil."""
    import psutil

    return int(psutil.Process().memory_info().vms)


class MemoryCap:
    """Makes a large device behave like one with ``cap_bytes`` of memory per process.

    CUDA: ``torch.cuda.set_per_process_memory_fraction``. CPU: ``RLIMIT_AS`` set to the address
    space the process had at :meth:`mark_baseline` plus ``cap_bytes`` (the soft limit only, which an
    unprivileged process may raise again), so that model, gradients,
    optimizer state and activations together must fit; a larger allocation fails for real with
    "DefaultCPUAllocator: can't allocate memory". (RLIMIT_DATA would slow every step about 4x.)
    From the baseline on, glibc's malloc keeps to the arenas it has: a thread started later (torch's
    pool, gloo's) would otherwise reserve an arena of 64 MiB of address space, more or less of them
    in a trial forked from the warm-start zygote than under ``torchrun``, so that the same
    configuration fitted in its trial and ran out of memory under ``explorer best``'s command.
    """

    def __init__(self, cap_bytes: int | None, device: torch.device) -> None:
        self.cap_bytes = cap_bytes
        self.device = device
        self.baseline: int | None = None
        self.baseline_rss = 0
        self._hard: int | None = None

    def mark_baseline(self) -> None:
        """Call after imports and process-group set-up, before the model is built."""
        reset_peak_rss()
        self.baseline_rss = _rss()
        if self.cap_bytes is None:
            return
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap_bytes / total), self.device)
        else:
            _no_new_malloc_arenas()
            self.baseline = _vm_size()

    def enforce(self) -> None:
        """Call once the model exists, before training: from here on, allocations may fail."""
        if self.cap_bytes is None or self.device.type == "cuda" or self.baseline is None:
            return
        limit = self.baseline + self.cap_bytes
        if _vm_size() >= limit:
            raise MemoryError(
                f"the model alone exceeds the memory cap of {self.cap_bytes / 2**30:.2f} GiB "
                "(DefaultCPUAllocator: can't allocate memory)"
            )
        self._hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (limit, self._hard))

    def release(self) -> None:
        """Lift the CPU limit so that reporting and shutdown cannot fail on it."""
        if self._hard is not None:
            resource.setrlimit(resource.RLIMIT_AS, (self._hard, self._hard))


_M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most malloc arenas (malloc.h)."""


def _no_new_malloc_arenas() -> None:
    """Cap glibc's malloc arenas at one: threads share the arenas that exist (a C library without
    ``mallopt``, such as musl, has no per-thread arenas to cap)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, 1)


def memory_limit_bytes(cap_bytes: int | None, device: torch.device, *, processes_here: int = 1) -> int:
    """The memory one process may use: ``cap_bytes`` when the study caps it, else the device's
    (CUDA: the GPU's total memory; CPU: the host's memory shared by ``processes_here`` processes)."""
    if cap_bytes is not None:
        return cap_bytes
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total) // max(1, processes_here)


def check_within_limit(peak_bytes: float, limit_bytes: int) -> None:
    """Raise when a measured peak exceeds the memory limit: such a configuration did not fit
    (on CPU the cap limits address space and the peak is resident memory, which may differ).

    Raises:
        MemoryError: ``peak_bytes > limit_bytes`` (the trial is OOM).
    """
    if peak_bytes > limit_bytes:
        raise MemoryError(
            f"peak memory {peak_bytes / 2**30:.3f} GiB exceeds the limit of {limit_bytes / 2**30:.3f} GiB "
            "per process (can't allocate memory)"
        )


def memory_figures(peak_reserved: float, peak_allocated: float, limit_bytes: int) -> dict[str, Any]:
    """The measurement's memory properties (``peak_memory_gib``, ``peak_memory_allocated_gib``,
    ``memory_limit_gib``, ``memory_headroom``) of the peaks over the processes, in bytes.

    Raises:
        MemoryError: the peak exceeds ``limit_bytes`` (:func:`check_within_limit`).
    """
    from explorer.measurement import memory_headroom

    check_within_limit(peak_reserved, limit_bytes)
    gib = float(2**30)
    return {
        "peak_memory_gib": peak_reserved / gib,
        "peak_memory_allocated_gib": peak_allocated / gib,
        "memory_limit_gib": limit_bytes / gib,
        "memory_headroom": memory_headroom(peak_reserved / gib, limit_bytes / gib),
    }


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


_PROC_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark (Linux: ``5`` to ``/proc/self/clear_refs``)
    to its current RSS; False where the kernel offers no reset."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int:
    """This process's peak resident set since its start or the last :func:`reset_peak_rss`.

    Linux: ``VmHWM`` of ``/proc/self/status``, the high-water mark of this process's own memory.
    Not ``getrusage``'s ``ru_maxrss``: Linux carries that across fork and exec, so a trial started
    by a large parent (a long pytest run, a driver holding a study) would report the parent's resident
    set as its own peak. Elsewhere (macOS) ``ru_maxrss``, which is in bytes there.
    """
    try:
        status = _PROC_STATUS.read_text()
    except OSError:
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_memory_bytes(device: torch.device, *, baseline_rss: int = 0) -> tuple[int, int]:
    """(peak reserved, peak allocated) on CUDA.

    On CPU: the peak resident set above ``baseline_rss`` (the process before the model was built),
    twice, so that the figure means what device memory means on a GPU: model, gradients, optimizer
    state and activations, without the interpreter and its libraries.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)
    peak = max(0, peak_rss_bytes() - baseline_rss)
    return peak, peak
