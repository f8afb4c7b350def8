"""A per-device memory model fitted to a study's own measured peaks (the memory prior).

    peak ~ k + p * params_share + r * rest_share + a * tokens (checkpointing off)
             + c * tokens (checkpointing on)

``params_share`` is the share of the parameters a device holds (1, or 1/N when FSDP FULL_SHARD
shards them over N GPUs); ``rest_share`` that of gradients and optimizer state (1, or 1/N under
FULL_SHARD and SHARD_GRAD_OP); ``tokens`` is the per-device batch times the sequence length.
These are what each strategy shards, not any model's byte counts: the coefficients are
non-negative least squares on the measured peaks of the feasible trials, so the model knows
nothing that the study has not measured.

A configuration predicted at or below the largest measured peak is taken to fit; one predicted at
or above the smallest prediction for a configuration that ran out of memory is taken not to;
between the two, it is unknown. Local search uses the verdict only to *order* neighbours (a
neighbour predicted to run out of memory goes after the others); it never skips one.
``benchmarks/memory_prior.py`` measures its error on the CPU table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from explorer.trial_config import TrialConfig

__all__ = ["MIN_POINTS", "MemoryModel"]

MIN_POINTS = 5
"""Fewest measured peaks to fit the five coefficients."""


def _features(c: TrialConfig) -> list[float]:
    n = c.number_gpus
    strategy = c.fsdp_sharding_strategy if c.distributed_backend == "FSDP" else None
    params = 1.0 / n if strategy == "FULL_SHARD" else 1.0
    rest = 1.0 / n if strategy in ("FULL_SHARD", "SHARD_GRAD_OP") else 1.0
    tokens = c.per_device_batch_size * c.model_max_length / 1e3
    return [
        1.0,
        params,
        rest,
        0.0 if c.gradient_checkpointing else tokens,
        tokens if c.gradient_checkpointing else 0.0,
    ]


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """Per-device peak memory, fitted to measured peaks (see the module docstring)."""

    coefficients: tuple[float, ...]
    """Non-negative weights of the five features."""
    fits_below: float
    """The largest measured peak: a prediction at or below it is taken to fit."""
    ooms_above: float
    """The smallest prediction for a configuration that ran out of memory (``inf``: none)."""

    @classmethod
    def fit(
        cls, peaks: Sequence[tuple[TrialConfig, float]], ooms: Sequence[TrialConfig]
    ) -> MemoryModel | None:
        """The model of these measurements; ``None`` with fewer than :data:`MIN_POINTS` peaks."""
        points = [(c, p) for c, p in peaks if math.isfinite(p) and p > 0]
        if len(points) < MIN_POINTS:
            return None
        import numpy as np
        from scipy.optimize import nnls

        x = np.array([_features(c) for c, _ in points])
        y = np.array([p for _, p in points])
        coef, _ = nnls(x, y)
        model = cls(
            coefficients=tuple(float(v) for v in coef), fits_below=float(y.max()), ooms_above=math.inf
        )
        above = min((model.predict(c) for c in ooms), default=math.inf)
        return cls(coefficients=model.coefficients, fits_below=model.fits_below, ooms_above=above)

    def predict(self, c: TrialConfig) -> float:
        """Predicted per-device peak memory of ``c``, in the unit of the measured peaks."""
        return sum(w * f for w, f in zip(self.coefficients, _features(c), strict=True))

    def fits(self, c: TrialConfig) -> bool | None:
        """``True``: predicted to fit; ``False``: predicted to run out of memory; ``None``: unknown."""
        m = self.predict(c)
        if m <= self.fits_below:
            return True
        if m >= self.ooms_above:
            return False
        return None


@dataclass(frozen=True)
class MemoryModels:
    """One :class:`MemoryModel` per GPU model (the ``gpu_model`` knob): a peak measured on one GPU
    model never predicts whether a configuration fits on another (their memories differ)."""

    by_gpu_model: dict[str | None, MemoryModel | None]

    @classmethod
    def fit(cls, peaks: Sequence[tuple[TrialConfig, float]], ooms: Sequence[TrialConfig]) -> MemoryModels:
        models = {c.gpu_model for c, _ in peaks} | {c.gpu_model for c in ooms}
        return cls(
            {
                m: MemoryModel.fit(
                    [(c, p) for c, p in peaks if c.gpu_model == m], [c for c in ooms if c.gpu_model == m]
                )
                for m in models
            }
        )

    def fits(self, c: TrialConfig) -> bool | None:
        """:meth:`MemoryModel.fits` of ``c``'s GPU model (``None``: no model fitted for it)."""
        model = self.by_gpu_model.get(c.gpu_model)
        return None if model is None else model.fits(c)
