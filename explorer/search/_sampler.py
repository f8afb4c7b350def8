"""The Optuna sampler a study file asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from explorer.spec import SamplerSpec

if TYPE_CHECKING:
    import optuna

__all__ = ["DEFAULT_STARTUP", "make_sampler"]

DEFAULT_STARTUP = 5
"""Random trials before TPE or GP (and local search) take over, unless the study file says."""


def make_sampler(spec: SamplerSpec) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, grouped for the conditional FSDP parameters), GP, random, or grid.

    ``grid`` is a random sampler here: the driver enqueues every configuration of the space first,
    which respects the conditional structure (Optuna's GridSampler does not).
    """
    import warnings

    import optuna

    if spec.kind == "tpe":
        with warnings.catch_warnings():  # `group` is experimental in Optuna 5.0, and what we want
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=spec.seed,
                multivariate=True,
                group=True,
                constant_liar=True,
                n_startup_trials=DEFAULT_STARTUP if spec.n_startup_trials is None else spec.n_startup_trials,
            )
    if spec.kind == "gp":
        # GP has no conditional spaces: it samples the backend and FSDP settings at random
        # (Optuna warns so on every trial; the study file's documentation says it once)
        return optuna.samplers.GPSampler(
            seed=spec.seed,
            n_startup_trials=DEFAULT_STARTUP if spec.n_startup_trials is None else spec.n_startup_trials,
            warn_independent_sampling=False,
        )
    return optuna.samplers.RandomSampler(seed=spec.seed)
