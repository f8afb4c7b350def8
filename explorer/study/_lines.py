"""How the optimize loop talks: a configuration in a few words, a trial's line, the best so far."""

from __future__ import annotations

from typing import TYPE_CHECKING

from explorer.knobs import knobs
from explorer.measurement import Measurement, Outcome
from explorer.study._objectives import best_feasible, objective_value
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

__all__ = ["better", "describe", "progress_line", "short", "stored_best"]


def describe(config: TrialConfig) -> str:
    """A short human-readable form of a configuration: each knob's label (:mod:`explorer.knobs`)."""
    return " ".join(part for k in knobs() if (part := k.short(config)) is not None)


def short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def better(best: tuple[float, int] | None, number: int, measurement: Measurement) -> tuple[float, int] | None:
    """``best`` updated with trial ``number``'s measurement."""
    if measurement.outcome is not Outcome.OK or measurement.properties is None:
        return best
    value = measurement.properties.dataset_tokens_per_second_per_gpu
    return (value, number) if best is None or value > best[0] else best


def stored_best(study: optuna.Study) -> tuple[float, int] | None:
    t = best_feasible(study)
    value = objective_value(t) if t is not None else None
    return (value, t.number) if t is not None and value is not None else None


def progress_line(
    done: int, total: int, number: int, status: str, config: str, detail: str, best: tuple[float, int] | None
) -> str:
    best_txt = f"best {best[0]:.1f} (trial {best[1]})" if best else "best -"
    return f"[{done:>3}/{total}] trial {number:<4} {status:<8} {config:<48} {detail} | {best_txt}"
