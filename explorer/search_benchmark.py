"""``explorer benchmark-search``: how fast does a sampler find the best configuration of a table?

Each *variant* is a search strategy (``sampler.strategy``, :mod:`explorer.search._strategies`)
and runs the study's optimize loop against a recorded table (the replay launcher), in a fresh
in-memory study per repeat, with seeds 0..R-1, whatever sampler the study file names (TPE with
explorer's settings behind the strategies that ask one):

* ``default``: explorer's default search: the frontier walk's probes while they fit, then the
  joint models of :mod:`explorer.search._surrogate` over the whole space (first-principles
  priors of :mod:`explorer.search._physics` scaled to the measured trials), TPE (multivariate,
  grouped, constant liar) as the sampler behind them, and OOM inference on;
* ``no-inference``: the same with OOM inference off;
* ``no-priors``: the walk variant (below) without the memory and throughput priors that order
  its neighbours;
* ``cover-start``: the default without the frontier walk (the joint models from the first trial);
* ``tpe-every-3``: the default with every third trial from TPE;
* ``no-local-search``: the same TPE (5 random start-up trials) and OOM inference, without local
  search;
* ``random``: Optuna's RandomSampler, no inference (ado's random walk, in effect);
* ``optuna``: Optuna's TPESampler with its defaults (plain TPE); OOM is still a constraint, no
  inference;
* ``walk``: the default before issue 23: the frontier walk, 5 covering start-up trials, then
  neighbours of the best configurations ordered by the memory and throughput priors;
* ``gp``: Optuna's GPSampler with its defaults (categorical parameters one-hot, conditional ones
  sampled independently); no inference.

A trial counts as in a study: reused and inferred answers are free; every measured trial counts,
OOM included. The target is 98% of the best feasible value the table holds for the study's space.
A table may carry a noise-free column (:data:`NOISE_FREE`): the search then sees the noisy
measurement and is scored by the noise-free value of what it found (so the target is not a lucky
draw). Each run records its sequence (the configurations' indices among the space's valid ones,
their scores and GPU-seconds): a trial costs its GPUs times its duration on the replay's clock
(the row's recorded ``wall_seconds``, else the study's simulated durations), and the GPU-hours to
reach the target are the sum over the counted trials up to the first that reaches it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.launch._replay import OBJECTIVE, ReplayTable
from explorer.spec import LoadedStudy
from explorer.spec._models import STRATEGIES

if TYPE_CHECKING:
    import optuna

    from explorer.trial_config import TrialConfig

__all__ = ["VARIANTS", "SearchRun", "benchmark_search", "best_in_table", "summarize_runs", "trial_sequence"]

VARIANTS = STRATEGIES
"""Every search strategy, by name: the variants compared."""
TARGET = 0.98
NOISE_FREE = "dataset_tokens_per_second_per_gpu_noise_free"
"""A table's noise-free objective, when it has one (a modelled table): what runs are scored by."""


@dataclass(frozen=True, kw_only=True)
class SearchRun:
    """One study run against the table: the counted trials' values in order (``None``: infeasible)."""

    variant: str
    seed: int
    values: list[float | None]
    """What the search saw (``None``: infeasible)."""
    inferred: int
    reused: int
    scores: list[float | None] | None = None
    """The noise-free value of each counted trial (``None``: the table has none; ``values`` score)."""
    gpu_seconds: list[float] | None = None
    """Each counted trial's GPUs times its duration on the replay's clock."""
    configs: list[int] | None = None
    """Each counted trial's configuration: its index among the space's valid configurations."""
    seconds: float = 0.0
    """Wall-clock seconds the run took (the loop, the search and the sampler)."""

    @property
    def scored(self) -> list[float | None]:
        return self.values if self.scores is None else self.scores

    def trials_to(self, target: float) -> int | None:
        """1-based index of the first counted trial at or above ``target``; ``None`` if never."""
        for i, v in enumerate(self.scored, start=1):
            if v is not None and v >= target:
                return i
        return None

    def gpu_hours_to(self, target: float) -> float | None:
        """GPU-hours of the counted trials up to the first at or above ``target``; ``None`` if never."""
        n = self.trials_to(target)
        if n is None or self.gpu_seconds is None:
            return None
        return sum(self.gpu_seconds[:n]) / 3600

    def best_after(self, n: int) -> float:
        feasible = [v for v in self.scored[:n] if v is not None]
        return max(feasible, default=0.0)


def best_in_table(loaded: LoadedStudy, table: ReplayTable) -> tuple[float, int, int]:
    """(best feasible score, configurations of the space in the table, of the space missing from it)."""
    from explorer.validity import invalid_reason

    best, present, missing = 0.0, 0, 0
    for config in loaded.space.enumerate():
        if invalid_reason(config, loaded.spec.resources) is not None:
            continue
        rows = table.lookup(config)
        if not rows:
            missing += 1
            continue
        present += 1
        best = max(best, score(table, config) or 0.0)
    return best, present, missing


def score(table: ReplayTable, config: TrialConfig) -> float | None:
    """What a run that found ``config`` is scored by: the median noise-free value of its valid
    rows where the table has that column, else the replay's answer; ``None``: infeasible."""
    from explorer.measurement import Outcome

    valid = [r for r in table.lookup(config) if r.valid and OBJECTIVE in r.values]
    if valid and all(NOISE_FREE in r.values for r in valid):
        return statistics.median(r.values[NOISE_FREE] for r in valid)
    m = table.measurement(config)
    if m.outcome is Outcome.OK and m.properties is not None:
        return m.properties.dataset_tokens_per_second_per_gpu
    return None


def gpu_seconds(loaded: LoadedStudy, table: ReplayTable, config: TrialConfig) -> float:
    """A trial's GPUs times its duration on the replay's clock: the row's recorded seconds, else
    the study's simulated duration of its outcome (without jitter)."""
    from explorer.launch import launcher_section
    from explorer.measurement import Outcome
    from explorer.spec import DurationSpec, ReplayLauncherSpec

    m = table.measurement(config)
    durations = launcher_section(loaded.spec, ReplayLauncherSpec).durations or DurationSpec()
    seconds = m.wall_seconds if durations.use_recorded and m.wall_seconds > 0 else 0.0
    if seconds <= 0:
        seconds = {Outcome.OK: durations.ok_s, Outcome.OOM: durations.oom_s}.get(
            m.outcome, durations.failed_s
        )
    return config.number_gpus * seconds


def _run_study(
    loaded: LoadedStudy, variant: str, seed: int, *, n_trials: int
) -> list[optuna.trial.FrozenTrial]:
    """One fresh study of ``n_trials`` counted trials against the replay table (Optuna's
    in-memory storage: the optimize loop is the same, the sqlite commits are not); its trials in
    order."""
    import optuna

    from explorer.spec import SamplerSpec
    from explorer.study import open_study, optimize

    # the study file's sampler (grid, say) is replaced by the variant's strategy, with TPE behind
    # it; OOM inference is the strategy's to turn off
    spec = loaded.spec.model_copy(
        update={
            "n_trials": n_trials,
            "infer_oom": True,
            "sampler": SamplerSpec(seed=seed, strategy=variant),
        }
    )
    run = dataclasses.replace(loaded, spec=spec)
    storage = optuna.storages.InMemoryStorage()
    optimize(run, printer=lambda _: None, storage=storage, write_ahead=False)
    trials = open_study(run, create=False, storage=storage).get_trials(deepcopy=False)
    return sorted(trials, key=lambda t: t.number)


def run_once(
    loaded: LoadedStudy, variant: str, seed: int, *, n_trials: int, index: dict[str, int] | None = None
) -> SearchRun:
    """One fresh study of ``n_trials`` counted trials against the replay table, summed up
    (``index``: configuration key -> index among the valid ones, see :func:`valid_index`)."""
    import time

    from explorer.record import TrialRecord
    from explorer.study import config_of, status_of
    from explorer.study._record import counts

    table = loaded.replay_table
    assert table is not None, "benchmark-search needs a replay table"
    start = time.process_time()
    trials = _run_study(loaded, variant, seed, n_trials=n_trials)
    seconds = time.process_time() - start
    counted = [t for t in trials if counts(t)]
    configs = [config_of(t) for t in counted]
    return SearchRun(
        variant=variant,
        seed=seed,
        values=[t.values[0] if status_of(t) == "ok" else None for t in counted],
        inferred=sum(TrialRecord.of(t).inferred_from is not None for t in trials),
        reused=sum(TrialRecord.of(t).reused_from is not None for t in trials),
        scores=[
            score(table, c) if status_of(t) == "ok" else None for t, c in zip(counted, configs, strict=True)
        ],
        gpu_seconds=[round(gpu_seconds(loaded, table, c), 1) for c in configs],
        configs=[index.get(c.key(), -1) for c in configs] if index is not None else None,
        seconds=seconds,
    )


def valid_index(loaded: LoadedStudy) -> dict[str, int]:
    """Each valid configuration's key and its index in the space's enumeration of the valid ones
    (what a run's recorded sequence refers to)."""
    from explorer.validity import invalid_reason

    valid = (c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None)
    return {c.key(): i for i, c in enumerate(valid)}


def trial_sequence(loaded: LoadedStudy, variant: str, seed: int, *, n_trials: int) -> list[tuple[str, str]]:
    """Every trial of one run, in order: its configuration key and how it was answered
    (``reused``, ``inferred``, else its status). The same seed walks the same sequence: a
    refactoring of the space, the search or the loop must not change it."""
    from explorer.record import TrialRecord
    from explorer.study import config_of

    def how(t: optuna.trial.FrozenTrial) -> str:
        record = TrialRecord.of(t)
        if record.reused_from is not None:
            return "reused"
        if record.inferred_from is not None:
            return "inferred"
        return record.status or t.state.name.lower()

    return [(config_of(t).key(), how(t)) for t in _run_study(loaded, variant, seed, n_trials=n_trials)]


def summarize_runs(
    runs: list[SearchRun], *, best: float, within: int = 30, after: int = 20
) -> dict[str, Any]:
    """The figures of one variant's runs."""
    target = TARGET * best
    needed = [r.trials_to(target) for r in runs]
    reached = [n for n in needed if n is not None]
    # a run that never reached the target counts as needing more than it had
    ranked = sorted(n if n is not None else math.inf for n in needed)
    counted = sum(len(r.values) for r in runs)
    infeasible = sum(v is None for r in runs for v in r.values)
    hours = [r.gpu_hours_to(target) for r in runs]
    extra: dict[str, Any] = {}
    if all(r.gpu_seconds is not None for r in runs):
        extra = {
            "median_gpu_hours_to_98pct": statistics.median(h if h is not None else math.inf for h in hours),
            "gpu_hours_to_98pct": [None if h is None else round(h, 4) for h in hours],
            "cpu_seconds_per_trial": sum(r.seconds for r in runs) / max(1, counted),
        }
    return {
        "runs": len(runs),
        "median_trials_to_98pct": statistics.median(ranked) if ranked else math.inf,
        "p90_trials_to_98pct": ranked[min(len(ranked) - 1, math.ceil(0.9 * len(ranked)) - 1)]
        if ranked
        else math.inf,
        f"share_reached_within_{within}": sum(n <= within for n in reached) / len(runs),
        f"mean_best_after_{after}_over_best": statistics.mean(r.best_after(after) / best for r in runs),
        "share_infeasible_trials": infeasible / counted if counted else 0.0,
        "inferred_per_run": statistics.mean(r.inferred for r in runs),
        "trials_to_98pct": needed,
    } | extra


def benchmark_search(
    loaded: LoadedStudy,
    *,
    repeats: int,
    n_trials: int,
    variants: tuple[str, ...] = VARIANTS,
    on_run: Callable[[SearchRun], None] | None = None,
    first_seed: int = 0,
    sequences: bool = False,
) -> dict[str, Any]:
    """Every variant ``repeats`` times (seeds ``first_seed`` onwards) against the table loaded
    once; returns the table's best and each variant's figures (``sequences``: each run's too)."""
    table = loaded.replay_table
    assert table is not None, "benchmark-search needs a replay table"
    best, present, missing = best_in_table(loaded, table)
    index = valid_index(loaded) if sequences else None
    out: dict[str, Any] = {
        "table": str(table.path),
        "objective": OBJECTIVE,
        "best": best,
        "configurations_in_table": present,
        "configurations_missing": missing,
        "n_trials": n_trials,
        "seeds": [first_seed, first_seed + repeats - 1],
        "scored_by": NOISE_FREE if any(NOISE_FREE in r.values for r in table.rows) else OBJECTIVE,
        "variants": {},
    }
    for variant in variants:
        runs = []
        for seed in range(first_seed, first_seed + repeats):
            run = run_once(loaded, variant, seed, n_trials=n_trials, index=index)
            runs.append(run)
            if on_run is not None:
                on_run(run)
        out["variants"][variant] = summarize_runs(runs, best=best)
        if sequences:
            out["variants"][variant]["sequences"] = [_sequence(r) for r in runs]
    return out


def runs_of(variant: str, sequences: list[dict[str, Any]]) -> list[SearchRun]:
    """The runs a result recorded with ``sequences`` (what :func:`_sequence` wrote)."""
    return [
        SearchRun(
            variant=variant,
            seed=s["seed"],
            values=s["value"],
            inferred=s["inferred"],
            reused=s["reused"],
            scores=s["score"],
            gpu_seconds=s["gpu_seconds"],
            configs=s["config"],
        )
        for s in sequences
    ]


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One table's two results with sequences as one: a variant's runs pooled where both have it
    (other seeds), kept as they are where one has it (other variants, run apart: Optuna's
    GPSampler in processes of its own), and every figure recomputed (the CPU seconds a trial:
    their mean, weighted by trials)."""
    assert a["table"] == b["table"] and a["best"] == b["best"] and a["n_trials"] == b["n_trials"]
    out = dict(a, seeds=[min(a["seeds"][0], b["seeds"][0]), max(a["seeds"][1], b["seeds"][1])], variants={})
    for variant in dict.fromkeys([*a["variants"], *b["variants"]]):
        parts = [v["variants"][variant] for v in (a, b) if variant in v["variants"]]
        sequences = [s for v in parts for s in v["sequences"]]
        figures = summarize_runs(runs_of(variant, sequences), best=a["best"])
        trials = [sum(len(s["config"]) for s in v["sequences"]) for v in parts]
        figures["cpu_seconds_per_trial"] = sum(
            v["cpu_seconds_per_trial"] * n for v, n in zip(parts, trials, strict=True)
        ) / max(1, sum(trials))
        out["variants"][variant] = figures | {"sequences": sequences}
    return out


def _sequence(run: SearchRun) -> dict[str, Any]:
    """One run as recorded: its seed and, per counted trial, the configuration's index, the value
    the search saw, its score and GPU-seconds."""
    assert run.configs is not None and run.gpu_seconds is not None
    return {
        "seed": run.seed,
        "config": run.configs,
        "value": run.values,
        "score": run.scored,
        "gpu_seconds": run.gpu_seconds,
        "inferred": run.inferred,
        "reused": run.reused,
    }


def format_table(result: dict[str, Any]) -> str:
    """The figures as a fixed-width table."""
    head = f"{'variant':16} {'median':>7} {'p90':>5} {'<=30':>6} {'best@20':>8} {'infeasible':>10} {'inferred':>8}"
    lines = [
        f"table {result['table']}: best {result['best']:.1f} {result['objective']}, "
        f"{result['configurations_in_table']} configurations ({result['configurations_missing']} of the space missing)",
        head,
    ]
    for name, v in result["variants"].items():
        lines.append(
            f"{name:16} {v['median_trials_to_98pct']:>7} {v['p90_trials_to_98pct']:>5} "
            f"{v['share_reached_within_30']:>6.0%} {v['mean_best_after_20_over_best']:>8.3f} "
            f"{v['share_infeasible_trials']:>10.0%} {v['inferred_per_run']:>8.1f}"
        )
    return "\n".join(lines)


def to_json(result: dict[str, Any]) -> str:
    """Strict JSON: a target never reached (infinite trials) is ``null``."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and math.isinf(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(result), indent=2, allow_nan=False)
