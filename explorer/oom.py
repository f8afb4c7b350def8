"""What counts as out-of-device-memory (shared by the worker and the launcher)."""

__all__ = ["OOM_MARKERS", "mentions_oom"]

OOM_MARKERS: tuple[str, ...] = (
    "out of memory",  # torch.cuda.OutOfMemoryError: CUDA out of memory
    "can't allocate memory",  # torch DefaultCPUAllocator under RLIMIT_AS
    "cannot allocate memory",
    "std::bad_alloc",
    "CUDA error: an illegal memory access was encountered",  # ado counts this as OOM
)


def mentions_oom(text: str) -> bool:
    """Whether an error text or log says the process ran out of device memory."""
    low = text.lower()
    return any(marker.lower() in low for marker in OOM_MARKERS)
