"""The CPU shim: FSDP on the CPU, where accelerate ignores it (a stand-in for GPUs, named as such).

accelerate only turns its FSDP plugin on for accelerator devices: a ``MULTI_CPU`` run (every CPU
run) silently wraps the model in DDP whatever ``fsdp``/``fsdp_config`` say. :class:`FsdpOnCpu`
switches the state to FSDP after the Trainer made its accelerator. On CUDA it does nothing: there
the written files alone shard.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FsdpOnCpu", "fsdp_on_cpu"]


def fsdp_on_cpu(trainer: Any) -> bool:
    """Switch ``trainer``'s accelerator state from ``MULTI_CPU`` to FSDP when its arguments ask for
    FSDP; ``True`` if it did. Call it right after the accelerator is made (:class:`FsdpOnCpu`)."""
    if trainer.args.fsdp_plugin_args is None or trainer.is_fsdp_enabled:
        return False
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if state.distributed_type is not DistributedType.MULTI_CPU:
        return False
    plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    # FSDP1 compares its compute device torch.device("cpu") with device_id; "cpu:0" would differ.
    state.device = PartialState._shared_state["device"] = torch.device("cpu")
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.fsdp_plugin = plugin
    trainer.is_fsdp_enabled = True
    return True


class FsdpOnCpu:
    """A mixin before a ``Trainer`` class (``class T(FsdpOnCpu, Trainer)``, or TRL's
    ``SFTTrainer``) that applies :func:`fsdp_on_cpu`; ``cpu_fsdp_shim`` says whether it did."""

    cpu_fsdp_shim: bool = False

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()  # type: ignore[misc]
        self.cpu_fsdp_shim = fsdp_on_cpu(self)
