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

A rank the kernel killed because its host's memory limit ran out (a cgroup's ``memory.max``,
Slurm's or a container's) writes nothing: it is SIGKILLed. The kernel counts each such kill in the
cgroup's ``oom_kill`` (cgroup v2 ``memory.events``, counted up the hierarchy; v1
``memory.oom_control``): :func:`host_oom_kills` read before and after a trial tells it from any
other SIGKILL, and the trial is out of memory (:data:`HOST_OOM`).

Any other fault is a failure, never OOM: ``CUDA error: an illegal memory access was encountered``
(a kernel's bug, e.g. bitsandbytes' 8-bit optimizer on FSDP2 parameters, bitsandbytes#1633),
cuBLAS and NCCL errors, a device-side assert. Counting one as OOM would let the search prune
configurations that fit. A failure is recorded by its first line (CUDA's messages go on with
advice about ``CUDA_LAUNCH_BLOCKING``).
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

__all__ = [
    "HOST_OOM",
    "OOM_MARKERS",
    "failure_line",
    "host_oom_kills",
    "is_oom_error",
    "last_error_line",
    "mentions_oom",
]

HOST_OOM = "killed by the host's memory limit (cgroup OOM kill)"
"""The error of a trial whose process the kernel killed for its cgroup's memory limit."""

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


def _cgroup_mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """``{"v2": (root, mount point), "v1": (root, mount point)}`` of the cgroup v2 hierarchy and
    the v1 memory controller, from ``/proc/self/mountinfo``'s text."""
    found: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        parts, fs = fields.split(), after.split()
        if len(parts) < 5 or len(fs) < 3:
            continue
        if fs[0] == "cgroup2":
            found.setdefault("v2", (parts[3], parts[4]))
        elif fs[0] == "cgroup" and "memory" in fs[2].split(","):
            found.setdefault("v1", (parts[3], parts[4]))
    return found


def _under(mount: tuple[str, str], path: str) -> Path:
    """Where cgroup ``path`` (as ``/proc/PID/cgroup`` names it) is in a hierarchy mounted at ``mount``."""
    root, point = mount
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return Path(point) / path.lstrip("/")


def _oom_kill(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def host_oom_kills(pid: int | str = "self", *, proc: Path = Path("/proc")) -> int | None:
    """The kernel's count of OOM kills in the memory cgroup of process ``pid`` (and, on cgroup v2,
    the cgroups below it), or ``None`` where no such count can be read (no memory controller, no
    cgroup file system). A process a trial starts is in its starter's cgroup, so the count rising
    while the trial ran means the kernel killed one of its processes for the limit."""
    try:
        groups = (proc / str(pid) / "cgroup").read_text()
        mounts = _cgroup_mounts((proc / "self" / "mountinfo").read_text())
    except OSError:
        return None
    counts = []
    for line in groups.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers and "v2" in mounts:
            where = _under(mounts["v2"], path) / "memory.events"
        elif "memory" in controllers.split(",") and "v1" in mounts:
            where = _under(mounts["v1"], path) / "memory.oom_control"
        else:
            continue
        try:
            count = _oom_kill(where.read_text())
        except OSError:
            continue
        if count is not None:
            counts.append(count)
    return sum(counts) if counts else None
