"""``explorer estimate``: every configuration's predicted throughput and peak memory, from the physics
alone before any trial and calibrated to the measured trials after.

The prediction is the search's own prior (:mod:`explorer.search._physics`, priced with the GPU's
figures from :mod:`explorer.gpus`); after trials, the search's joint models
(:mod:`explorer.search._surrogate`): the physics' parts scaled to the measured throughputs, peaks
and OOMs (:mod:`explorer.search._calibrate`), and a Gaussian process over the knobs' values on top,
whose posterior gives the band. No CUDA, no Ray and
no hub access: a study written for a GPU node is estimated on a laptop, given the model's
architecture in the study file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError
from explorer.gpus import describe_measured, missing_figures, study_figures

if TYPE_CHECKING:
    import optuna

    from explorer.search._physics import JobPhysics
    from explorer.spec import LoadedStudy
    from explorer.trial_config import TrialConfig

__all__ = ["PRIOR_BAND", "Estimate", "Measured", "estimate", "estimate_study", "parse_sets"]

PRIOR_BAND = 2.0
"""Before any trial, the band is the prediction divided and multiplied by this: the physics' MFU
assumption alone (0.5 at large steps) is off by up to 2x against published runs (MFU 0.17-0.64 in
``benchmarks/evidence/measurements.csv``)."""
BAND_SDS = 2.0
"""After trials, the band is this many standard deviations of the joint model's log-throughput
(its Gaussian process's posterior) either way."""


@dataclass(frozen=True)
class Measured:
    """What a trial measured of one configuration."""

    config: TrialConfig
    tokens_per_second_per_gpu: float | None
    """Dataset tokens a second per GPU (``None``: an OOM)."""
    peak_memory_gib: float | None = None


@dataclass(frozen=True)
class Estimate:
    """One configuration's prediction."""

    config: dict[str, Any]
    """The searched knobs' values (those the configuration uses)."""
    key: str
    dataset_tokens_per_second_per_gpu: float
    band: tuple[float, float]
    peak_memory_gib: float
    fits: bool | None
    """Whether the peak fits the device's memory (``None``: the limit is not known)."""
    measured: float | None = None
    """The measured throughput, where a trial ran it (``0.0``: it ran out of memory)."""

    def as_json(self) -> dict[str, Any]:
        low, high = self.band
        return {
            "config": self.config,
            "key": self.key,
            "dataset_tokens_per_second_per_gpu": round(self.dataset_tokens_per_second_per_gpu, 1),
            "band": {"low": round(low, 1), "high": round(high, 1)},
            "peak_memory_gib": round(self.peak_memory_gib, 3),
            "fits": self.fits,
            "measured_dataset_tokens_per_second_per_gpu": self.measured,
        }


def parse_sets(sets: Sequence[str], knob_names: Iterable[str]) -> dict[str, str]:
    """``KNOB=VALUE`` pairs (``--set``), each knob one of ``knob_names``.

    Raises:
        SpecError: a pair without ``=`` or an unknown knob.
    """
    from explorer.errors import did_you_mean

    names = list(knob_names)
    out: dict[str, str] = {}
    for item in sets:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise SpecError(file="--set", field=item, problem="expected KNOB=VALUE")
        if name.strip() not in names:
            raise SpecError(
                file="--set", field=name, problem="not a knob of this study" + did_you_mean(name, names)
            )
        out[name.strip()] = value.strip()
    return out


def _matches(config: TrialConfig, sets: dict[str, str]) -> bool:
    """Whether ``config`` takes every ``--set`` value (compared as text, case aside)."""
    return all(str(getattr(config, k)).casefold() == v.casefold() for k, v in sets.items())


def estimate(
    physics: JobPhysics,
    configs: list[TrialConfig],
    params: Any,
    measured: Sequence[Measured] = (),
    space: Any = None,
) -> list[Estimate]:
    """Every configuration's estimate, best first (those that fit before those that do not):
    the physics alone, or after trials the search's joint models (:mod:`explorer.search._surrogate`:
    the physics calibrated to the trials, and a Gaussian process over the knobs' values on top)
    fitted to ``measured`` (``params``: a configuration's searched values)."""
    import numpy as np

    from explorer.search._surrogate import Encoding, Surrogate

    keys = [c.key() for c in configs]
    done = {m.config.key(): m for m in measured}
    for m in measured:  # a measured configuration outside the space still calibrates
        if m.config.key() not in set(keys):
            configs = [*configs, m.config]
    enc = Encoding.of(space, configs, physics)
    model = Surrogate.fit(
        enc,
        feasible=[
            (m.config, m.tokens_per_second_per_gpu) for m in done.values() if m.tokens_per_second_per_gpu
        ],
        ooms=[m.config for m in done.values() if m.tokens_per_second_per_gpu is None],
        peaks=[(m.config, m.peak_memory_gib) for m in done.values() if m.peak_memory_gib],
    )
    rows = np.arange(len(keys))
    if model.speed is not None:
        log_rate, sd = model.speed.predict(rows)
        spread = BAND_SDS * np.maximum(sd, 0.0)
    else:
        log_rate = model.speed_prior[rows]
        spread = np.full(len(keys), math.log(PRIOR_BAND))
    limit = physics.limit_gib
    assert enc.parts is not None
    gib = enc.parts.memory_gib(np.ones(enc.parts.memory.shape[1]))[rows]
    fits: list[bool | None] = [None if limit is None else bool(g <= limit) for g in gib]
    if model.memory is not None and limit:
        mu, _ = model.memory.predict(rows)
        gib = np.exp(mu) * limit
        fits = [bool(m <= 0.0) for m in mu]
    out = []
    for i, c in enumerate(configs[: len(keys)]):
        rate = float(np.exp(log_rate[i]))
        seen = done.get(keys[i])
        out.append(
            Estimate(
                config=dict(params(c)),
                key=keys[i],
                dataset_tokens_per_second_per_gpu=rate,
                band=(rate * math.exp(-spread[i]), rate * math.exp(spread[i])),
                peak_memory_gib=float(gib[i]),
                fits=fits[i],
                measured=None if seen is None else float(seen.tokens_per_second_per_gpu or 0.0),
            )
        )
    return sorted(out, key=lambda e: (e.fits is False, -e.dataset_tokens_per_second_per_gpu))


def stored_measurements(loaded: LoadedStudy) -> list[Measured] | None:
    """The study's measured trials (ok and OOM), from its storage opened read-only; ``None``: no
    stored study yet."""
    from explorer.record import TrialRecord
    from explorer.study import answered_without_running, config_of
    from explorer.study._record import status_of

    study = _stored(loaded)
    if study is None:
        return None
    out = []
    for t in study.get_trials(deepcopy=False):
        status = status_of(t)
        if status not in ("ok", "oom") or answered_without_running(t):
            continue
        record = TrialRecord.of(t)
        rate = record.per_gpu if status == "ok" else None
        if status == "ok" and not rate:
            continue
        out.append(Measured(config_of(t), rate, record.peak_memory_gib))
    return out


def recorded_node(loaded: LoadedStudy) -> dict[str, Any] | None:
    """The figures ``explorer doctor`` measured on a node of the study's GPU model, from its
    storage opened read-only; ``None``: no stored study, or never measured."""
    from explorer.record import StudyRecord

    study = _stored(loaded)
    return None if study is None else StudyRecord.of(study).measured_node(loaded.spec.resources.model)


def _stored(loaded: LoadedStudy) -> optuna.Study | None:
    """The study's storage opened read-only; ``None``: no stored study yet."""
    from explorer.study import load_readonly

    try:
        return load_readonly(loaded)
    except SpecError as exc:
        if exc.field in ("storage", "name"):
            return None
        raise


def estimate_study(
    loaded: LoadedStudy, *, sets: dict[str, str], measured: Sequence[Measured] | None = None
) -> list[Estimate]:
    """``explorer estimate``'s rows for a loaded study (``measured``: instead of its stored trials).

    The physics is priced with :func:`study_figures`, the node's figures that ``explorer
    doctor`` recorded on the study included.

    Raises:
        SpecError: an unknown GPU without declared figures, no architecture, or no valid
            configuration takes the ``--set`` values.
    """
    from explorer.search._physics import JobPhysics
    from explorer.validity import invalid_reason

    spec, label = loaded.spec, str(loaded.file)
    r = spec.resources
    node = recorded_node(loaded)
    if r.device != "cpu":
        for model in r.models:
            problem = missing_figures(model, r.gpu, node if model == r.model else None)
            if problem is not None:
                raise SpecError(file=label, field="resources.gpu", problem=problem)
    if not spec.workload.model.architecture:
        raise SpecError(
            file=label,
            field="workload.model.architecture",
            problem="estimate needs the model's shape: copy hidden_size, num_hidden_layers, "
            "num_attention_heads, intermediate_size, vocab_size from its config.json",
        )
    physics = JobPhysics(workload=spec.workload, resources=r, figures=study_figures(r, node))
    configs = [c for c in loaded.space.enumerate() if invalid_reason(c, r) is None and _matches(c, sets)]
    if not configs:
        wanted = " ".join(f"{k}={v}" for k, v in sets.items())
        raise SpecError(
            file="--set", field=wanted, problem="no valid configuration of the study takes these values"
        )
    if measured is None:
        measured = stored_measurements(loaded) or []
    searched = [n for n, d in loaded.space.domains.items() if len(d.values) > 1]

    def params(c: TrialConfig) -> dict[str, Any]:
        return {n: v for n in searched if (v := getattr(c, n, None)) is not None}

    return estimate(physics, configs, params, measured, loaded.space)


def describe(loaded: LoadedStudy, rows: list[Estimate], *, top: int, measured: int) -> list[str]:
    """The rows as text: a header saying what priced them, then the ``top`` best."""
    r = loaded.spec.resources
    node = recorded_node(loaded)
    gpu = study_figures(r, node) if r.device != "cpu" or node else None
    if gpu is not None and node:
        hardware = f"{r.model} ({describe_measured(gpu, node)})"
    elif gpu is not None:
        hardware = f"{r.model} ({gpu.peak_flops / 1e12:g} TFLOP/s bf16, {gpu.memory_gb:g} GB, {gpu.link} {gpu.link_gbs:g} GB/s)"
    else:
        hardware = f"{r.model} (CPU processes{'' if measured else ': ranked, not priced'})"
    basis = (
        f"calibrated to {measured} measured trial(s)"
        if measured
        else f"physics alone, before any trial (band: /{PRIOR_BAND:g} to x{PRIOR_BAND:g})"
    )
    cap = _limit_gib(loaded)
    limit = "unknown" if cap is None else f"{cap:g} GiB"
    lines = [
        f"{loaded.spec.name}: {len(rows)} configuration(s) on {r.total_gpus} x {hardware}; {basis}; memory limit {limit}",
        f"{'#':>3}  {'tokens/s/GPU':>12}  {'band':>21}  {'peak GiB':>9}  {'fits':>4}  {'measured':>9}  configuration",
    ]
    for i, e in enumerate(rows[:top], 1):
        low, high = e.band
        fits = "?" if e.fits is None else "yes" if e.fits else "no"
        seen = "" if e.measured is None else f"{e.measured:.0f}"
        knobs = " ".join(f"{k}={v}" for k, v in e.config.items())
        lines.append(
            f"{i:>3}  {e.dataset_tokens_per_second_per_gpu:>12.0f}  {low:>9.0f} - {high:<9.0f}  "
            f"{e.peak_memory_gib:>9.2f}  {fits:>4}  {seen:>9}  {knobs}"
        )
    return lines


def _limit_gib(loaded: LoadedStudy) -> float | None:
    """The memory a device may use in a study (the cap, else the device's, measured where
    ``explorer doctor`` measured it; ``None``: unknown)."""
    r = loaded.spec.resources
    if r.device_memory_gib is not None:
        return r.device_memory_gib
    node = recorded_node(loaded)
    gpu = study_figures(r, node) if r.device != "cpu" or node else None
    if gpu is None:
        return None
    from explorer.search._physics import usable_gib

    return usable_gib(gpu)  # the measured memory, else what CUDA reports: the physics' limit


def run(path: str, *, storage: str | None, sets: Sequence[str], top: int, as_json: bool) -> int:
    """``explorer estimate``: print the estimates of a study file's configurations."""
    import json

    from explorer.knobs import knobs
    from explorer.study_file import load_study

    loaded = load_study(path, storage=storage, check_model=False, check_launcher=False, check_hub=False)
    chosen = parse_sets(sets, [k.name for k in knobs()])
    measured = stored_measurements(loaded) or []
    rows = estimate_study(loaded, sets=chosen, measured=measured)
    if as_json:
        print(json.dumps([e.as_json() for e in rows[:top]], indent=1))
    else:
        print("\n".join(describe(loaded, rows, top=top, measured=len(measured))))
    return 0
