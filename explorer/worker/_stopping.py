"""Stop rules for the measured window: pure functions of the step clock, testable without training."""

from __future__ import annotations

import math
from dataclasses import dataclass

from explorer.spec import MeasurementSpec

__all__ = ["Decision", "decide", "relative_ci", "steady_warmup", "t_quantile_975", "warmup_at_least"]


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (scipy's)."""
    from scipy.stats import t

    return math.inf if df < 1 else float(t.ppf(0.975, df))


def relative_ci(samples: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean, relative to the mean."""
    n = len(samples)
    if n < 2:
        return math.inf
    mean = sum(samples) / n
    var = sum((x - mean) ** 2 for x in samples) / (n - 1)
    return t_quantile_975(n - 1) * math.sqrt(var / n) / mean if mean > 0 else math.inf


@dataclass(frozen=True)
class Decision:
    """Where the measured window starts, and whether (and why) to stop now."""

    warmup: int
    """Steps excluded as warmup (the window starts at the end of step ``warmup``)."""
    stop: bool
    reason: str = ""


def decide(spec: MeasurementSpec, *, start: float, ends: list[float]) -> Decision:
    """Apply ``spec``'s stop rule to the step clock.

    Args:
        start: Clock at the start of the first step.
        ends: Clock at the end of each optimizer step so far.
    """
    rule = spec.rule
    if rule == "warmup_then_stable":
        warm = sum(1 for e in ends if e - start <= spec.warmup_seconds)
        if warm == 0 or warm == len(ends):
            return Decision(warmup=warm, stop=False)
        begin = ends[warm - 1]
        done = ends[-1] - begin >= spec.stable_seconds and len(ends) - warm >= spec.stable_steps
        return Decision(warmup=warm, stop=done, reason="warmup_then_stable" if done else "")
    w = spec.warmup_steps
    measured = len(ends) - w
    if measured <= 0:
        return Decision(warmup=w, stop=False)
    if rule == "steps":
        done = measured >= spec.measured_steps
        return Decision(warmup=w, stop=done, reason="steps" if done else "")
    if rule == "seconds":
        done = ends[-1] - start >= (spec.stop_after_seconds or 0.0)
        return Decision(warmup=w, stop=done, reason="stop_after_seconds" if done else "")
    # the window never holds more than max_steps: the spike warmup may shrink as the median grows
    # (a step that was a spike no longer is), which would let the window jump past the cap
    w = max(steady_warmup(spec, start=start, ends=ends), len(ends) - spec.max_steps)
    measured = len(ends) - w
    if measured <= 0:  # the latest step was a spike
        return Decision(warmup=w, stop=False)
    begin = ends[w - 1] if w else start
    durations = _durations(begin, ends[w:])
    if measured >= spec.min_steps and relative_ci(durations) <= spec.target_rel_ci:
        return Decision(warmup=w, stop=True, reason="stable")
    if measured >= spec.max_steps:
        return Decision(warmup=w, stop=True, reason="max_steps")
    if ends[-1] - begin >= spec.max_seconds:
        return Decision(warmup=w, stop=True, reason="max_seconds")
    return Decision(warmup=w, stop=False)


def warmup_at_least(spec: MeasurementSpec, steps: int, *, start: float, ends: list[float]) -> MeasurementSpec:
    """``spec`` with a warmup of at least the first ``steps`` steps (the steps in which torch.compile
    compiled: compile time belongs in the warmup, never in the measured window).

    A step-counted warmup grows to ``steps``; ``warmup_then_stable``'s warmup in seconds grows to the
    end of step ``steps``. ``spec`` itself when its warmup already covers them.
    """
    if steps <= 0:
        return spec
    if spec.rule == "warmup_then_stable":
        through = ends[steps - 1] - start
        return spec if through <= spec.warmup_seconds else spec.model_copy(update={"warmup_seconds": through})
    return spec if steps <= spec.warmup_steps else spec.model_copy(update={"warmup_steps": steps})


def _durations(start: float, ends: list[float]) -> list[float]:
    return [b - a for a, b in zip([start, *ends[:-1]], ends, strict=True)]


def steady_warmup(spec: MeasurementSpec, *, start: float, ends: list[float]) -> int:
    """The ``steady`` rule's warmup: ``warmup_steps``, extended past one-off spikes.

    A step among the first ``min_steps`` after ``warmup_steps`` that takes more than
    ``spike_factor`` times the median step of everything after ``warmup_steps`` is a one-off
    (allocator growth, lazy initialisation, a first collective): it would take a short window many
    steps to average out, so the window starts after the last such step instead. Spikes later in
    the window are kept: they recur, and the long run pays for them too. The warmup never grows
    past ``warmup_steps + min_steps``, so the rule stays a function of the step clock alone.
    """
    w = spec.warmup_steps
    if spec.spike_factor is None or len(ends) - w < 3:
        return w
    durations = _durations(ends[w - 1] if w else start, ends[w:])
    limit = spec.spike_factor * sorted(durations)[len(durations) // 2]
    head = durations[: spec.min_steps]
    spikes = [i for i, d in enumerate(head) if d > limit]
    return w + spikes[-1] + 1 if spikes else w
