"""The configuration one trial runs: what the search space produces and the worker consumes.

Its fields are the knobs of :mod:`explorer.knobs`, read as attributes (``config.batch_size``).
"""

from __future__ import annotations

import functools
from typing import Any

from explorer.knobs import BACKENDS, FSDP_SHARDING_STRATEGIES, FSDP_VERSIONS, knobs
from explorer.knobs._registry import KNOBS

__all__ = [
    "BACKENDS",
    "FSDP_SHARDING_STRATEGIES",
    "FSDP_VERSIONS",
    "KEY_ORDER",
    "TrialConfig",
    "VARYING_SHAPES",
    "field_names",
]

KEY_ORDER = (
    "batch_size",
    "number_gpus",
    "distributed_backend",
    "gradient_checkpointing",
    "model_max_length",
    "fsdp_sharding_strategy",
    "fsdp_version",
    "gradient_accumulation_steps",
    "lora_r",
    "optim",
    "torch_compile",
    "number_nodes",
)
"""The knobs of the first configuration key, in its order: they are always in a key (but where
``None``), so that stored measurements and keys stay valid. Never add to it: a knob declared
later enters a key after these, and only where it is not at its default."""


VARYING_SHAPES = ("longest", "packed")
"""``padding`` modes whose batches change shape from step to step."""


def field_names() -> list[str]:
    """Every knob's name in a configuration's order: the first key's (:data:`KEY_ORDER`), then
    the knobs declared later, in registry order (exports, ``to_dict``, the key)."""
    return [*KEY_ORDER, *(k.name for k in knobs() if k.name not in KEY_ORDER)]


class TrialConfig:
    """One point of the search space, fully resolved (no defaults left to the worker).

    Immutable and hashable; equal when every knob is. A knob left out takes its default, else
    its inactive value (``TypeError`` for a required knob that always applies, or an unknown
    name).
    """

    _values: dict[str, Any]
    _hash: int

    def __init__(self, **values: Any) -> None:
        unknown = values.keys() - KNOBS.keys()
        if unknown:
            raise TypeError(f"unknown TrialConfig fields: {sorted(unknown)}")
        resolved = {}
        for k in KNOBS.values():  # the registry itself: a configuration is built many times a trial
            if k.name in values:
                resolved[k.name] = values[k.name]
            elif k.required and k.when is None:
                raise TypeError(f"TrialConfig needs {k.name}")
            else:
                resolved[k.name] = k.default if k.default is not None else k.inactive
            if k.settle is not None:
                resolved[k.name] = k.settle(resolved[k.name], resolved)
        # the knobs are plain instance attributes (read many times a proposal: no __getattr__)
        self.__dict__.update(resolved)
        self.__dict__["_values"] = resolved
        self.__dict__["_hash"] = hash(tuple(resolved.items()))

    def __getattr__(self, name: str) -> Any:
        """Only reached for a name that is no knob of this configuration."""
        raise AttributeError(f"TrialConfig has no knob {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("TrialConfig is immutable; use replace()")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrialConfig) and self._hash == other._hash and self._values == other._values

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return "TrialConfig(" + ", ".join(f"{n}={v!r}" for n, v in self._values.items()) + ")"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.to_dict(),))

    @property
    def per_device_batch_size(self) -> int:
        """Samples per process and micro-step (``batch_size // number_gpus``)."""
        return int(self.batch_size) // max(1, int(self.number_gpus))

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: ``batch_size`` (all GPUs) times ``gradient_accumulation_steps``."""
        return int(self.batch_size) * int(self.gradient_accumulation_steps or 1)

    @property
    def compiles_dynamic(self) -> bool:
        """Whether ``torch.compile`` should take dynamic shapes from the first step: a compiled
        configuration whose batches change shape from step to step (:data:`VARYING_SHAPES`)."""
        return bool(self.torch_compile) and self.padding in VARYING_SHAPES

    @property
    def sharded(self) -> bool:
        """Whether parameters are wrapped by FSDP."""
        return bool(self.distributed_backend == "FSDP")

    @property
    def process_group(self) -> bool:
        """Whether the trial's processes form a torch.distributed process group: more than one
        process, or FSDP on one (accelerate wraps a model in FSDP only inside a group)."""
        return int(self.number_gpus) > 1 or int(self.number_nodes) > 1 or self.sharded

    def replace(self, **changes: Any) -> TrialConfig:
        """This configuration with ``changes``."""
        return TrialConfig(**{**self._values, **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for JSON, the trial record and exports (first-key order, then the rest)."""
        return {n: self._values[n] for n in field_names() if n in self._values}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialConfig:
        """Inverse of :meth:`to_dict`; rejects unknown keys. A knob the dict lacks (one written
        before the knob existed) takes its default."""
        names = {k.name for k in knobs()}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown TrialConfig fields: {sorted(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    def key(self) -> str:
        """Canonical identifier, in the style of ado's entity identifiers.

        Two configurations that run the same job have the same key. A knob declared after the
        first key's (:data:`KEY_ORDER`) enters it only where it is not at its default, so that
        adding a knob leaves every earlier key valid.
        """
        return _key(self)


def _rebuild(values: dict[str, Any]) -> TrialConfig:
    return TrialConfig(**values)


@functools.lru_cache(maxsize=65536)
def _key(config: TrialConfig) -> str:
    # the optimize loop asks for keys of the same configurations many times a trial
    defaults = {k.name: k.default for k in knobs()}
    parts = []
    for name, value in config.to_dict().items():
        if value is None or (name not in KEY_ORDER and value == defaults.get(name)):
            continue
        parts.append(f"{name}.{value}")
    return "-".join(parts)
