"""What ``explorer optimize`` prints at the end: best configuration, top five, where to look."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from explorer.study import (
    OBJECTIVE,
    answered_without_running,
    config_of,
    describe,
    mask_url,
    open_study,
    status_of,
)

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy
    from explorer.study import OptimizeResult

__all__ = ["feasible_ranking", "print_summary"]


def feasible_ranking(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Measured (status ok) trials, best first; a reused answer is not a second entry."""
    ok = [
        t
        for t in study.get_trials(deepcopy=False)
        if status_of(t) == "ok" and t.value is not None and not answered_without_running(t)
    ]
    return sorted(ok, key=lambda t: t.value or 0.0, reverse=True)


def print_summary(
    loaded: LoadedStudy, result: OptimizeResult, printer: Callable[[str], None] = print
) -> None:
    """Print the end of an ``explorer optimize`` run: counts, the best trial, the top five, where.

    Args:
        loaded: The study that ran.
        result: What this run did.
        printer: Where the lines go.
    """
    study = open_study(loaded, create=False)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items()))
    printer("")
    printer(
        f"{result.counted}/{result.n_trials} trials done in {result.wall_seconds:.0f} s this run ({counts})"
    )
    ranking = feasible_ranking(study)
    if ranking:
        best = ranking[0]
        printer(f"best: trial {best.number}: {best.value:.1f} {OBJECTIVE}")
        config = config_of(best)
        printer("      " + " ".join(f"{k}={v}" for k, v in config.to_dict().items() if v is not None))
        printer(f"      peak memory {best.user_attrs.get('peak_memory_gib', float('nan')):.2f} GiB")
        printer("top 5:")
        for t in ranking[:5]:
            printer(f"  trial {t.number:<4} {t.value:>12.1f}  {describe(config_of(t))}")
    else:
        printer("no feasible configuration yet")
    url = mask_url(loaded.storage_url)
    printer(f"storage: {url} (study {loaded.spec.name!r})")
    printer(f"dashboard: optuna-dashboard {url}")
