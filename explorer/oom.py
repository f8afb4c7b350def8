"""What counts as out-of-memory (shared by the worker and the launcher), and a failure's one line.

Out of memory is what an allocator says when it cannot give memory: the exception types
(``torch.OutOfMemoryError``, ``MemoryError``, ``OSError`` ENOMEM) and the allocators' own
messages, read from torch 2.13:

* CUDA's caching allocator: ``CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ...``
  (raised as ``torch.OutOfMemoryError``);
* the CUDA runtime's ``cudaErrorMemoryAllocation``: ``CUDA error: out of memory``;
* the CPU allocator (the project's memory cap, ``RLIMIT_AS``, ends here): ``DefaultCPUAllocator:
  can't allocate memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)``,
  C++'s ``std::bad_alloc``, and the cap's own ``MemoryError`` (:mod:`explorer.worker._memory`).

Any other fault is a failure, never OOM: ``CUDA error: an illegal memory access was encountered``
(a kernel's bug, e.g. bitsandbytes' 8-bit optimizer on FSDP2 parameters, bitsandbytes#1633),
cuBLAS and NCCL errors, a device-side assert. Counting one as OOM would let the search prune
configurations that fit. A failure is recorded by its first line (CUDA's messages go on with
advice about ``CUDA_LAUNCH_BLOCKING``).
"""

from __future__ import annotations

import errno
import re

__all__ = ["OOM_MARKERS", "failure_line", "is_oom_error", "last_error_line", "mentions_oom"]

OOM_MARKERS: tuple[str, ...] = (
    "CUDA out of memory",  # torch.OutOfMemoryError from the CUDA caching allocator
    "CUDA error: out of memory",  # cudaErrorMemoryAllocation outside the caching allocator
    "OutOfMemoryError",  # a traceback's last line: torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
    "DefaultCPUAllocator: can't allocate memory",  # torch's CPU allocator (under RLIMIT_AS: the cap)
    "std::bad_alloc",  # a C++ allocation under the cap: "terminate called after throwing ..."
    "[Errno 12] Cannot allocate memory",  # OSError ENOMEM (fork or mmap under the cap)
)
"""Texts an allocator writes when it cannot give memory, matched as they are (case-sensitive)."""


def mentions_oom(text: str) -> bool:
    """Whether an error text or a process's output says an allocator ran out of memory."""
    return any(marker in text for marker in OOM_MARKERS)


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the configuration does not fit in memory: its type, else the
    allocator's message in its text (an exception that wraps one)."""
    import torch

    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    return mentions_oom(str(exc))


def failure_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (the rest of a CUDA error is advice, not the fault)."""
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


_ERROR_LINE = re.compile(r"^\s*([\w.]*(Error|Exception)|terminate called)\b.*")


def last_error_line(text: str) -> str | None:
    """The last line of a process's output that names an error (a traceback's last line, C++'s
    ``terminate called ...``), to say why a process that wrote nothing else ended."""
    lines = [m.group(0).strip() for m in map(_ERROR_LINE.match, text.splitlines()) if m]
    return lines[-1] if lines else None
