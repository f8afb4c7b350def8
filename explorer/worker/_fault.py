"""Worker faults (a study's ``faults:``): real failures, struck as an optimizer step begins.

Nothing here fakes an outcome: ``oom`` asks the device for more memory than it has (the CPU's
"DefaultCPUAllocator: can't allocate memory", CUDA's ``torch.OutOfMemoryError``), ``crash``
ends the process with a non-zero status, ``segfault`` reads address 0, ``hang`` sleeps until the
launcher's trial timeout kills the process group. The driver classifies what happened as it
would any other trial.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

import torch
from transformers import TrainerCallback

from explorer.fault import CRASH_EXIT_STATUS, WORKER_FAULTS, InjectedFault

__all__ = ["FaultCallback", "strike"]

OOM_BYTES = 1 << 60
"""An allocation no device has (an exbibyte)."""


def strike(kind: str, *, device: torch.device, rank: int) -> None:
    """Make fault ``kind`` happen in this rank now (``crash``/``segfault``: rank 0 only)."""
    print(f"explorer: injected fault {kind!r} strikes rank {rank}", file=sys.stderr, flush=True)
    if kind == "oom":
        torch.empty(OOM_BYTES, dtype=torch.uint8, device=device)
    elif kind == "crash" and rank == 0:
        os._exit(CRASH_EXIT_STATUS)
    elif kind == "segfault" and rank == 0:
        ctypes.string_at(0)
    elif kind == "hang":
        while True:
            time.sleep(3600)


class FaultCallback(TrainerCallback):
    """Strikes a worker fault as optimizer step ``fault.at_step`` begins."""

    def __init__(self, fault: InjectedFault, *, device: torch.device) -> None:
        if fault.kind not in WORKER_FAULTS:
            raise ValueError(f"{fault.kind!r} is not a worker fault")
        self.fault = fault
        self.device = device

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.fault.at_step:
            strike(self.fault.kind, device=self.device, rank=int(os.environ.get("RANK", "0")))
