"""Device memory: the per-process cap, the peak, and what counts as out-of-memory.

The CUDA branches are complete code that has never run in this project's CI (no GPU here).
"""

from __future__ import annotations

import resource

import torch

from explorer.oom import is_oom_error

__all__ = ["MemoryCap", "is_oom", "peak_memory_bytes"]


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
    """

    def __init__(self, cap_bytes: int | None, device: torch.device) -> None:
        self.cap_bytes = cap_bytes
        self.device = device
        self.baseline: int | None = None
        self.baseline_rss = 0
        self._hard: int | None = None

    def mark_baseline(self) -> None:
        """Call after imports and process-group set-up, before the model is built."""
        self.baseline_rss = _rss()
        if self.cap_bytes is None:
            return
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap_bytes / total), self.device)
        else:
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


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def peak_memory_bytes(device: torch.device, *, baseline_rss: int = 0) -> tuple[int, int]:
    """(peak reserved, peak allocated) on CUDA.

    On CPU: the peak resident set above ``baseline_rss`` (the process before the model was built),
    twice, so that the figure means what device memory means on a GPU: model, gradients, optimizer
    state and activations, without the interpreter and its libraries.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)
    peak = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline_rss)
    return peak, peak
