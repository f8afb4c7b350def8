"""When a trial held its GPUs: what a launcher records for GPU-slot utilization.

A launcher adds one :class:`GpuSlot` to each measurement it hands back, under
``Measurement.extra["slot"]``; the study stores it as the trial's ``slot`` user attribute (one
storage commit), and :mod:`explorer.study._utilization` reads it back from there.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Literal

from explorer.measurement import Measurement

__all__ = ["SLOT_ATTR", "GpuSlot", "new_run_id"]

SLOT_ATTR = "slot"
"""The user attribute (and ``Measurement.extra`` key) that holds a trial's :class:`GpuSlot`."""

Clock = Literal["virtual", "wall"]


def new_run_id() -> str:
    """An id for one launcher's lifetime: slots of one run share a clock and a pool."""
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True, kw_only=True)
class GpuSlot:
    """The GPUs one trial held, and from when to when, on its launcher's clock."""

    run: str
    """The launcher run that held them: starts and ends compare only within a run (a replay
    launcher's virtual clock starts at 0 in every run)."""
    clock: Clock
    """``virtual``: seconds on the replay launcher's clock; ``wall``: Unix time on the driver."""
    pool: int
    """GPUs the launcher had in all."""
    gpus: int
    """GPUs this trial held."""
    start: float
    """When the launcher started the trial (its GPUs were taken)."""
    end: float
    """When the launcher saw it finish (its GPUs were free again)."""

    def __post_init__(self) -> None:
        if not (0 < self.gpus <= self.pool):
            raise ValueError(f"a slot of {self.gpus} GPUs on a pool of {self.pool}")
        if not (math.isfinite(self.start) and math.isfinite(self.end) and self.end >= self.start):
            raise ValueError(f"a slot from {self.start} to {self.end}")

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds the trial held."""
        return self.gpus * (self.end - self.start)

    def to_attr(self) -> dict[str, Any]:
        """The JSON value stored as the trial's ``slot`` user attribute."""
        return asdict(self)

    def stamp(self, measurement: Measurement, **changes: Any) -> Measurement:
        """``measurement`` (with ``changes``) carrying this slot, as a launcher hands it back."""
        extra = {**measurement.extra, SLOT_ATTR: self.to_attr()}
        return dataclasses.replace(measurement, extra=extra, **changes)

    @classmethod
    def from_attr(cls, value: Any) -> GpuSlot:
        """Parse a stored ``slot`` user attribute.

        Raises:
            ValueError: not a mapping with exactly the fields of a slot, or values out of range.
        """
        if not isinstance(value, dict):
            raise ValueError(f"a slot is a mapping, not {type(value).__name__}")
        expected = {"run", "clock", "pool", "gpus", "start", "end"}
        if set(value) != expected:
            raise ValueError(f"a slot has the fields {sorted(expected)}, not {sorted(value)}")
        clock = value["clock"]
        if clock not in ("virtual", "wall"):
            raise ValueError(f"unknown slot clock {clock!r}")
        return cls(
            run=str(value["run"]),
            clock=clock,
            pool=int(value["pool"]),
            gpus=int(value["gpus"]),
            start=float(value["start"]),
            end=float(value["end"]),
        )
