"""Confirming the best before it is named: the configurations within noise of it re-measured
interleaved (A B C A B C ...) until the best separates from them or the confirmation budget is
spent. The verdict (``confirmed``, or ``tied`` with the most robust one recommended) is recorded
on the study (``StudyKey.CONFIRMATION``); the re-measurements are launcher jobs, never trials of
the study, so they neither count towards ``n_trials`` nor change the search."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from explorer.knobs import knobs
from explorer.measurement import Measurement, Outcome
from explorer.record import StudyKey, StudyRecord, TrialRecord, counts, status_of, write_study
from explorer.study._objectives import objective_value, ranking_sign, trial_values
from explorer.study._record import answered_without_running, config_of
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy, StudySpec

__all__ = [
    "BUDGET_SHARE",
    "CONFIRM_JOB_BASE",
    "MAX_CANDIDATES",
    "candidates",
    "confirm",
    "current_verdict",
    "imprecise_line",
    "named_best",
    "rel_ci",
    "verdict_lines",
]

Measure = Callable[[TrialConfig, int], Measurement]
"""Measure a configuration once more as launcher job number ``int``."""
Printer = Callable[[str], None]

CONFIRM_JOB_BASE = 1_000_000
"""Confirmation measurements run as launcher jobs numbered above this (their own work folders,
``trial-1000001`` on), never as trials of the study."""
MAX_CANDIDATES = 4
"""At most this many configurations (the best among them) are re-measured."""
BUDGET_SHARE = 0.25
"""The default confirmation budget: this share of the GPU-seconds the study's counted trials took."""
MAX_ROUNDS = 50
"""At most this many rounds (where measurements cost nothing, as on a replay without durations)."""
PRIOR_DF = 4
"""The measurements' own step-time CIs weigh as this many degrees of freedom of the spread of
repeated measurements (the rest: the repeats' own scatter)."""
HEADROOM_STEP = 0.05
"""Memory headrooms in the same step of this size count as the same when recommending among ties."""
HEADROOM_ENOUGH = 0.2
"""Memory headroom beyond this fraction of the limit makes a configuration no more robust."""


def rel_ci(trial: optuna.trial.FrozenTrial) -> float:
    """The trial's step-time 95% CI as a fraction (0 where none was measured)."""
    ci = TrialRecord.of(trial).step_time_rel_ci
    return ci if ci is not None and math.isfinite(ci) and ci > 0 else 0.0


def _headroom(trial: optuna.trial.FrozenTrial, cap_gib: float | None = None) -> float | None:
    record = TrialRecord.of(trial)
    peak, limit = record.peak_memory_gib, record.memory_limit_gib or cap_gib
    if peak is None or not limit or not math.isfinite(peak):
        return None
    return (limit - peak) / limit


def ranking(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Measured feasible trials, best first (each configuration once; a peak over its limit is
    not feasible), as ``explorer.report.feasible_ranking`` ranks them."""
    sign = ranking_sign(study)
    ok = [
        t
        for t in study.get_trials(deepcopy=False)
        if status_of(t) == "ok"
        and objective_value(t) is not None
        and not answered_without_running(t)
        and (_headroom(t) or 0.0) >= 0.0
    ]
    return sorted(ok, key=lambda t: sign * (objective_value(t) or 0.0), reverse=True)


def candidates(ranked: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The best of ``ranked`` and the trials whose gap to it is within their combined 95%
    intervals (the best's lead is not clear), best first, at most :data:`MAX_CANDIDATES`."""
    best = ranked[0]
    top = objective_value(best) or 0.0
    picked = [best]
    for t in ranked[1:]:
        value = objective_value(t) or 0.0
        if abs(top - value) <= math.hypot(abs(top) * rel_ci(best), abs(value) * rel_ci(t)):
            picked.append(t)
    return picked[:MAX_CANDIDATES]


def study_gpu_seconds(study: optuna.Study) -> float:
    """GPU-seconds the study's counted trials took (wall seconds times GPUs)."""
    total = 0.0
    for t in study.get_trials(deepcopy=False):
        if counts(t):
            record = TrialRecord.of(t)
            total += (record.wall_seconds or 0.0) * record.number_gpus
    return total


@dataclass
class _Arm:
    """One configuration being re-measured: its trial, and its scores (``sign * log(value)``,
    the trial's own first); higher is better."""

    trial: optuna.trial.FrozenTrial
    config: TrialConfig
    scores: list[float]
    cis: list[float]
    """Each measurement's own step-time 95% CI (a fraction; 0: none)."""
    cost: float
    active: bool = True
    dropped: str | None = None

    @property
    def mean(self) -> float:
        return statistics.fmean(self.scores)


@dataclass
class _Run:
    """A confirmation in progress: what was measured and spent."""

    arms: list[_Arm]
    budget: float
    sign: float
    target: float
    spent: float = 0.0
    rounds: int = 0
    measurements: list[dict[str, Any]] = field(default_factory=list)
    spread: float = 0.0
    """Pooled standard deviation of the scores (log scale); 0 before any round."""
    quantile: float = 0.0
    """Student's t 0.975 quantile at the pooled degrees of freedom."""

    def half(self, a: _Arm, b: _Arm) -> float:
        """The 95% half-width of the difference of two arms' mean scores."""
        return self.quantile * self.spread * math.sqrt(1 / len(a.scores) + 1 / len(b.scores))


def _score(value: float, sign: float) -> float:
    return sign * math.log(value) if value > 0 else -math.inf


def _measure_round(run: _Run, study: optuna.Study, measure: Measure, job: int) -> int:
    """Measure every active arm once, in order, as far as the budget goes (a round may end short);
    returns the next job number."""
    for arm in [a for a in run.arms if a.active]:
        if run.spent + arm.cost > run.budget:
            break
        m = measure(arm.config, job)
        gpu_s = m.wall_seconds * arm.config.number_gpus
        value = None
        if m.outcome is Outcome.OK and m.properties is not None:
            config = arm.config
            value = trial_values(
                study, m.properties, number_gpus=config.number_gpus, gpu_model=config.gpu_model
            )[0]
            arm.scores.append(_score(value, run.sign))
            arm.cis.append(m.properties.step_time_rel_ci or 0.0)
        else:
            arm.active, arm.dropped = False, m.outcome.value
        run.spent += gpu_s
        run.measurements.append(
            {
                "trial": arm.trial.number,
                "job": job,
                "status": m.outcome.value,
                "value": value,
                "gpu_seconds": gpu_s,
            }
        )
        job += 1
    run.rounds += 1
    return job


def _settled(run: _Run) -> bool:
    """After a round: drop the arms the leader is clearly ahead of; ``True`` when one is left, or
    the rest are known to within the target precision (a tie)."""
    from scipy.stats import t as student

    measured = [a for a in run.arms if len(a.scores) > 1 and a.dropped is None]
    df = sum(len(a.scores) - 1 for a in measured)
    if df < 1:
        return False
    squares = sum(sum((x - a.mean) ** 2 for x in a.scores) for a in measured)
    # the measurements' own CIs stand for PRIOR_DF degrees of freedom of the spread
    cis = [math.log1p(c) / 1.96 for a in measured for c in a.cis if math.isfinite(c)]
    prior = statistics.fmean(c * c for c in cis) if cis else 0.0
    run.spread = math.sqrt((PRIOR_DF * prior + squares) / (PRIOR_DF + df))
    run.quantile = float(student.ppf(0.975, PRIOR_DF + df))
    active = [a for a in run.arms if a.active]
    if not active:
        return True
    leader = max(active, key=lambda a: a.mean)
    for arm in active:
        if arm is not leader and leader.mean - arm.mean > run.half(leader, arm):
            arm.active = False
    rest = [a for a in active if a.active and a is not leader]
    return not rest or all(run.half(leader, a) < math.log1p(run.target) for a in rest)


def _knobs_off_default(config: TrialConfig) -> int:
    values = config.to_dict()
    return sum(1 for k in knobs() if k.default is not None and values.get(k.name) not in (None, k.default))


def _robustness(arm: _Arm, cap_gib: float | None) -> tuple[int, int, int, float]:
    """Sort key, most robust first: most memory headroom (in steps of :data:`HEADROOM_STEP`, up to
    :data:`HEADROOM_ENOUGH`), fewest GPUs, fewest knobs off their defaults, highest mean."""
    headroom = _headroom(arm.trial, cap_gib)
    step = round(min(headroom, HEADROOM_ENOUGH) / HEADROOM_STEP) if headroom is not None else -1
    return (-step, arm.config.number_gpus, _knobs_off_default(arm.config), -arm.mean)


def _why(pick: _Arm, other: _Arm, cap_gib: float | None) -> str:
    """Why ``pick`` is recommended over ``other``, the next most robust of the tie."""
    a, b = _robustness(pick, cap_gib), _robustness(other, cap_gib)
    n = other.trial.number
    if a[0] != b[0]:
        ha, hb = (100 * (_headroom(x.trial, cap_gib) or 0.0) for x in (pick, other))
        return f"most memory headroom: {ha:.0f}% vs {hb:.0f}% for trial {n}"
    if a[1] != b[1]:
        return f"fewest GPUs: {pick.config.number_gpus} vs {other.config.number_gpus} for trial {n}"
    if a[2] != b[2]:
        return f"fewest knobs off their defaults: {a[2]} vs {b[2]} for trial {n}"
    return f"as robust as trial {n} by memory, GPUs and knobs; the higher measured mean"


def _verdict(run: _Run, cap_gib: float | None) -> dict[str, Any]:
    """The record of a finished confirmation: confirmed, or tied with the recommendation."""
    alive = [a for a in run.arms if a.active] or [a for a in run.arms if a.dropped is None] or run.arms
    alive.sort(key=lambda a: a.mean, reverse=True)
    leader = alive[0]
    verdict: dict[str, Any] = {
        "verdict": "confirmed",
        "best": leader.trial.number,
        "tied": [leader.trial.number],
    }
    if len(alive) > 1:
        if run.rounds and run.spread > 0:
            within = max(math.expm1(leader.mean - a.mean + run.half(leader, a)) for a in alive[1:])
        else:  # nothing re-measured: their own intervals
            within = max(math.hypot(rel_ci(leader.trial), rel_ci(a.trial)) for a in alive[1:])
        robust = sorted(alive, key=lambda a: _robustness(a, cap_gib))
        verdict.update(
            verdict="tied",
            tied=[a.trial.number for a in alive],
            within=within,
            recommended=robust[0].trial.number,
            why=_why(robust[0], robust[1], cap_gib),
        )
    verdict["estimates"] = {str(a.trial.number): math.exp(run.sign * a.mean) for a in run.arms}
    verdict["dropped"] = {str(a.trial.number): a.dropped for a in run.arms if a.dropped}
    return verdict


def confirm(
    study: optuna.Study, spec: StudySpec, measure: Measure, printer: Printer
) -> dict[str, Any] | None:
    """Confirm the study's best (see the module): re-measure its rivals within noise through
    ``measure``, record the verdict on the study and return it (``None``: no feasible trial, or
    ``confirm_budget_gpu_s`` is 0)."""
    ranked = ranking(study)
    if (
        not ranked
        or spec.confirm_budget_gpu_s == 0
        or (spec.confirm_budget_gpu_s is None and _all_stored(study))
    ):
        return None
    counted = sum(1 for t in study.get_trials(deepcopy=False) if counts(t))
    previous = StudyRecord.of(study).confirmation or {}
    if previous.get("counted") == counted and previous.get("best") in {t.number for t in ranked}:
        return previous  # judged already, on the same trials
    budget = spec.confirm_budget_gpu_s
    budget = BUDGET_SHARE * study_gpu_seconds(study) if budget is None else budget
    sign, picked = ranking_sign(study), candidates(ranked)
    arms = [
        _Arm(t, config_of(t), [_score(objective_value(t) or 0.0, sign)], [rel_ci(t)], _cost(t))
        for t in picked
    ]
    run = _Run(arms, budget=budget, sign=sign, target=spec.measurement.target_rel_ci)
    job = CONFIRM_JOB_BASE + 1 + int(previous.get("jobs", 0))  # each job its own work folder
    if len(arms) > 1:
        printer(
            f"confirming: trial(s) {[a.trial.number for a in arms[1:]]} within noise of trial "
            f"{arms[0].trial.number}; re-measuring them interleaved (budget {budget:.0f} GPU-s)"
        )
    while run.rounds < MAX_ROUNDS and _affordable(run):
        job = _measure_round(run, study, measure, job)
        if _settled(run):
            break
    verdict = _verdict(run, spec.resources.device_memory_gib)
    verdict.update(
        counted=counted,
        candidates=[a.trial.number for a in arms],
        measurements=run.measurements,
        gpu_seconds=run.spent,
        budget_gpu_s=budget,
        rounds=run.rounds,
        jobs=job - CONFIRM_JOB_BASE - 1,
    )
    write_study(study, StudyKey.CONFIRMATION, verdict)
    return verdict


def _affordable(run: _Run) -> bool:
    """Whether another round is wanted (two or more arms left) and its first two measurements fit
    the budget."""
    active = [a for a in run.arms if a.active]
    return len(active) > 1 and run.spent + active[0].cost + active[1].cost <= run.budget


def _all_stored(study: optuna.Study) -> bool:
    """Whether every counted trial is an answer from the measurement store: such a study ran
    nothing, and re-measures nothing unless its study file gives a budget."""
    return all(
        TrialRecord.of(t).reused_from_store is not None for t in study.get_trials(deepcopy=False) if counts(t)
    )


def _cost(trial: optuna.trial.FrozenTrial) -> float:
    record = TrialRecord.of(trial)
    return (record.wall_seconds or 0.0) * record.number_gpus


def current_verdict(study: optuna.Study) -> dict[str, Any] | None:
    """The recorded confirmation, where it judged the trials the study counts now (``None``: never
    confirmed, or trials were added since)."""
    verdict = StudyRecord.of(study).confirmation
    if verdict is None:
        return None
    counted = sum(1 for t in study.get_trials(deepcopy=False) if counts(t))
    return verdict if verdict.get("counted") == counted else None


def verdict_lines(study: optuna.Study, file: str) -> list[str]:
    """What ``optimize``, ``best``, ``report`` and ``plan`` say of the best: confirmed, tied (and
    which one is recommended, why), a lead clear of the intervals, or not confirmed (and the
    command that confirms)."""
    verdict = current_verdict(study)
    if verdict is None:
        ranked = ranking(study)
        if not ranked:
            return []
        rivals = candidates(ranked)[1:]
        if not rivals:
            return [
                f"clear: trial {ranked[0].number}'s lead exceeds every rival's 95% interval (nothing to confirm)"
            ]
        ci = 100 * rel_ci(ranked[0])
        why = (
            "trials were added since it was confirmed"
            if StudyRecord.of(study).confirmation
            else "never confirmed"
        )
        how = (
            f"set confirm_budget_gpu_s in {file} (its answers came from the measurement store, which "
            f"re-measures nothing by default), then `explorer optimize {file}` re-measures them and confirms"
            if _all_stored(study)
            else f"`explorer optimize {file}` re-measures them and confirms"
        )
        return [
            f"not confirmed ({why}): trial {ranked[0].number}'s +-{ci:.1f}% interval is wider than its lead "
            f"over trial(s) {[t.number for t in rivals]}; {how}"
        ]
    cost = (
        f"{verdict['rounds']} round(s), {verdict['gpu_seconds']:.0f} of {verdict['budget_gpu_s']:.0f} GPU-s"
    )
    if verdict["verdict"] == "confirmed":
        rivals = [n for n in verdict["candidates"] if n != verdict["best"]]
        how = f"ahead of trial(s) {rivals} ({cost})" if rivals else "its lead exceeds every rival's interval"
        return [f"confirmed: trial {verdict['best']} is the best; {how}"]
    tied = ", ".join(str(n) for n in verdict["tied"])
    return [
        f"tied: these {len(verdict['tied'])} within {100 * verdict['within']:.1f}%: trials {tied} ({cost})",
        f"recommended: trial {verdict['recommended']} ({verdict['why']})",
    ]


def named_best(study: optuna.Study) -> tuple[int | None, bool]:
    """The trial the recorded verdict names (confirmed, or recommended among the tied; ``None``:
    no current verdict), and whether the best's lead is unconfirmed (its interval is wider than
    the gap to a rival and no current verdict judged it)."""
    verdict = current_verdict(study)
    if verdict is not None:
        return int(verdict.get("recommended", verdict["best"])), False
    ranked = ranking(study)
    return None, bool(ranked) and len(candidates(ranked)) > 1


def imprecise_line(loaded: LoadedStudy, cis: list[float], measured: int) -> str | None:
    """The one line a run prints at its end when trials missed ``measurement.target_rel_ci``:
    how many, and the field of the study file that would tighten them (``None``: none missed)."""
    if not cis:
        return None
    m, file = loaded.spec.measurement, loaded.file
    if m.rule == "steady":
        fix = f"raise measurement.max_seconds (now {m.max_seconds:g}) or max_steps (now {m.max_steps}) in {file}"
    elif m.rule == "steps":
        fix = (
            f"set measurement.stop: steady in {file} (measures until the target, capped by max_seconds)"
            f", or raise measurement.measured_steps (now {m.measured_steps})"
        )
    else:
        fix = f"set measurement.stop: steady in {file}"
    return (
        f"imprecise: {len(cis)} of {measured} measured trial(s) missed the +-{100 * m.target_rel_ci:.2g}% "
        f"step-time target (widest +-{100 * max(cis):.1f}%); to tighten: {fix}"
    )
