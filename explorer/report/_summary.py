"""What ``explorer optimize`` prints at the end: best configuration, top five, where to look."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from explorer.commands import hint_lines
from explorer.record import TrialRecord
from explorer.report._headroom import memory_flag
from explorer.report._ranking import feasible_ranking
from explorer.secrets import mask_url
from explorer.study import OBJECTIVE, config_of, describe, named_best, verdict_lines
from explorer.study._objectives import objective_value, pareto_front

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy
    from explorer.study import OptimizeResult

__all__ = ["pareto_lines", "print_summary"]


def print_summary(
    loaded: LoadedStudy, result: OptimizeResult, study: optuna.Study, printer: Callable[[str], None] = print
) -> None:
    """Print the end of an ``explorer optimize`` run: counts, the best trial, the top five, where.

    Args:
        loaded: The study that ran.
        result: What this run did.
        study: The study, opened by the caller (who closes its storage).
        printer: Where the lines go.
    """
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items()))
    printer("")
    printer(
        f"{result.counted}/{result.n_trials} trials done in {result.wall_seconds:.0f} s this run ({counts})"
    )
    chosen, unconfirmed = named_best(study)  # confirmed, or the most robust of a tie
    ranking = sorted(feasible_ranking(study), key=lambda t: t.number != chosen)  # stable
    if ranking:
        best = ranking[0]
        named = "leading (not confirmed)" if unconfirmed else "best"
        printer(f"{named}: trial {best.number}: {objective_value(best):.1f} {OBJECTIVE}")
        for line in verdict_lines(study, str(loaded.file)):
            printer(f"      {line}")
        config = config_of(best)
        printer("      " + " ".join(f"{k}={v}" for k, v in config.to_dict().items() if v is not None))
        peak = TrialRecord.of(best).peak_memory_gib
        printer(f"      peak memory {peak if peak is not None else float('nan'):.2f} GiB")
        resources = loaded.spec.resources
        flag = memory_flag(ranking, margin=loaded.spec.memory_margin, cap_gib=resources.device_memory_gib)
        for line in flag.lines() if flag is not None else []:
            printer(line)
        printer("top 5:")
        for t in ranking[:5]:
            printer(f"  trial {t.number:<4} {objective_value(t):>12.1f}  {describe(config_of(t))}")
    else:
        printer("no feasible configuration yet")
    for line in pareto_lines(study):
        printer(line)
    printer(f"storage: {mask_url(loaded.storage_url)} (study {loaded.spec.name!r})")
    then = () if result.measured_nothing else ("report", "best")  # nothing to report on
    for line in hint_lines(loaded, then=then):  # each runs as printed
        printer(line)


def pareto_lines(study: optuna.Study) -> list[str]:
    """The Pareto front of a multi-objective study, one line a trial (nothing for one objective)."""
    if len(study.directions) < 2:
        return []
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    front = pareto_front(study)
    head = " / ".join(f"{n} ({d.name.lower()})" for n, d in zip(names, study.directions, strict=True))
    lines = [f"Pareto front ({len(front)} trials): {head}"]
    for t in front:
        values = " / ".join(f"{v:.4g}" for v in t.values)
        lines.append(f"  trial {t.number:<4} {values:<28} {describe(config_of(t))}")
    return lines
