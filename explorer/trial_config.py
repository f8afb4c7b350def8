"""The configuration one trial runs: what the search space produces and the worker consumes."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "BACKENDS",
    "FSDP_SHARDING_STRATEGIES",
    "FSDP_VERSIONS",
    "TrialConfig",
]

Backend = Literal["NONE", "DDP", "FSDP"]
BACKENDS: tuple[str, ...] = ("DDP", "FSDP")
FSDP_SHARDING_STRATEGIES: tuple[str, ...] = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
FSDP_VERSIONS: tuple[int, ...] = (1, 2)


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """One point of the search space, fully resolved (no defaults left to the worker)."""

    batch_size: int
    """Global batch size per optimizer micro-step, spread evenly over ``number_gpus`` (as in ado)."""
    number_gpus: int
    """Processes (one per GPU) that train together."""
    distributed_backend: Backend
    """``NONE`` for a single device, else ``DDP`` or ``FSDP``."""
    gradient_checkpointing: bool
    """Activation checkpointing of every decoder layer."""
    model_max_length: int
    """Sequences are truncated to, and right-padded to, this many tokens."""
    fsdp_sharding_strategy: str | None = None
    """FSDP only: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or NO_SHARD."""
    fsdp_version: int | None = None
    """FSDP only: 1 (FullyShardedDataParallel) or 2 (fully_shard / FSDPModule)."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step."""
    lora_r: int | None = None
    """LoRA rank when the workload's method is LoRA; ``None`` for full fine-tuning."""
    optim: str = "adamw_torch"
    """An HF ``TrainingArguments.optim`` name."""
    torch_compile: bool = False
    """Wrap the model with ``torch.compile``."""
    number_nodes: int = 1
    """Nodes the GPUs are spread over (the parallelism degree, not the world size, lives here)."""

    @property
    def per_device_batch_size(self) -> int:
        """Samples per process and micro-step (``batch_size // number_gpus``)."""
        return self.batch_size // max(1, self.number_gpus)

    @property
    def sharded(self) -> bool:
        """Whether parameters are wrapped by FSDP."""
        return self.distributed_backend == "FSDP"

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for JSON, Optuna user_attrs and exports."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        """Inverse of :meth:`to_dict`; rejects unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown TrialConfig fields: {sorted(unknown)}")
        return cls(**data)

    def key(self) -> str:
        """Canonical identifier, in the style of ado's entity identifiers.

        Two configurations that run the same job have the same key.
        """
        return _key(self)


@functools.lru_cache(maxsize=65536)
def _key(config: TrialConfig) -> str:
    # the optimize loop asks for keys of the same configurations many times a trial
    return "-".join(
        f"{f.name}.{v}" for f in dataclasses.fields(config) if (v := getattr(config, f.name)) is not None
    )
