"""What a study already knows: its measured configurations, OOMs and feasible values.

The optimize loop answers repeats from it, infers OOMs from it, and local search climbs from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from explorer.record import TrialRecord
from explorer.study._record import answered_without_running, config_of, status_of
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

__all__ = ["Known"]


@dataclass(kw_only=True)
class Known:
    """Measured (or stored) answers of one study, by configuration key."""

    measured: dict[str, optuna.trial.FrozenTrial] = field(default_factory=dict)
    """ok and oom trials that ran or came from the store (not repeats, not inferred)."""
    ooms: list[tuple[int, TrialConfig]] = field(default_factory=list)
    """(trial number, configuration) of every measured OOM: the proofs OOM inference cites."""
    feasible: dict[str, tuple[TrialConfig, float, int]] = field(default_factory=dict)
    """(configuration, objective value times :attr:`sign`, trial number) of every measured feasible
    configuration."""
    peaks: dict[str, tuple[TrialConfig, float]] = field(default_factory=dict)
    """(configuration, measured per-device peak memory) of the feasible ones that report it."""
    sign: float = 1.0
    """``-1.0`` when the study's first objective is minimized: :attr:`feasible` holds the value
    times it, so that higher is better either way."""
    failed: set[str] = field(default_factory=set)
    """Keys of the configurations that failed for good (their retries spent): local search and
    ``explore`` propose them no more (the sampler may; a repeat then runs again)."""

    @classmethod
    def from_study(cls, study: optuna.Study) -> Known:
        from explorer.study._objectives import ranking_sign

        known = cls(sign=ranking_sign(study))
        for t in study.get_trials(deepcopy=False):
            status = status_of(t)
            if status in ("ok", "oom") and not answered_without_running(t):
                known.learn(t, config_of(t))
            elif status == "failed":
                known.failed.add(config_of(t).key())
        return known

    def answered(self) -> set[str]:
        """Keys of the configurations with an answer: measured, stored, or failed for good."""
        return set(self.measured) | self.failed

    def learn(self, trial: optuna.trial.FrozenTrial, config: TrialConfig) -> None:
        """Add a finished ok or oom trial that measured ``config``."""
        status = status_of(trial)
        self.measured[config.key()] = trial
        if status == "oom":
            self.ooms.append((trial.number, config))
        elif status == "ok" and trial.values:
            self.feasible[config.key()] = (config, self.sign * float(trial.values[0]), trial.number)
            peak = TrialRecord.of(trial).peak_memory_gib
            if peak is not None and math.isfinite(peak) and peak > 0:
                self.peaks[config.key()] = (config, float(peak))
