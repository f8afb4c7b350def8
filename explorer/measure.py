"""``explorer measure``: one configuration outside any study, through the same launcher a trial uses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from explorer.errors import SpecError
from explorer.job import TrialJob
from explorer.knobs import asking_order
from explorer.measurement import Measurement, Outcome
from explorer.spec import LoadedStudy, read_yaml
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    from explorer.launch import Launcher

__all__ = ["config_from_cli", "measure", "none_measured", "with_measurement"]


def config_from_cli(loaded: LoadedStudy, *, sets: list[str], config_file: str | None) -> TrialConfig:
    """A TrialConfig from ``--config FILE`` and ``--set name=value`` (the latter win).

    A knob neither gives takes what the study's space fixes it to, else its default (the
    workload's, for the sequence length and LoRA rank), else its ``measure_default`` (DDP, FSDP2,
    FULL_SHARD); each value is checked like a search-space value. A value for a knob that does
    not apply (``fsdp_version`` with DDP) is left out, as the search space would.

    Raises:
        SpecError: an unknown name, a bad value, or a missing required knob.
    """
    from explorer.space import Fixed

    values: dict[str, Any] = {}
    if config_file:
        raw = read_yaml(Path(config_file))
        if not isinstance(raw, dict):
            raise SpecError(file=config_file, field="", problem="must be a mapping of configuration fields")
        values.update(raw)
    for item in sets:
        name, sep, text = item.partition("=")
        if not sep:
            raise SpecError(file="--set", field=item, problem="use name=value")
        values[name.strip()] = yaml.safe_load(text)
    for name, value in values.items():
        _check_set(str(name), value, loaded)
    space = loaded.space
    fixed = {name: d.value for name, d in space.domains.items() if isinstance(d, Fixed)}
    resolved: dict[str, Any] = {}
    for k in asking_order():
        if not k.applies(resolved, space.facts, space.domains):
            resolved[k.name] = k.inactive
            continue
        default = k.default_from(loaded.spec.workload) if k.default_from is not None else k.default
        given = [
            v for v in (values.get(k.name), fixed.get(k.name), default, k.measure_default) if v is not None
        ]
        if not given and k.required:
            raise SpecError(
                file="--set", field=k.name, problem="required (the study's space does not fix it)"
            )
        resolved[k.name] = given[0] if given else None
    return TrialConfig(**resolved)


def _check_set(name: str, value: Any, loaded: LoadedStudy) -> None:
    """Refuse an unknown knob, or a value of the wrong kind, that the knob's checks refuse or
    that the study's device or model cannot run (checked as a search-space value is)."""
    from explorer.space import Fixed, facts_of, parameter_domain

    domain = parameter_domain(
        name,
        value,
        file="--set",
        field=name,
        check_transformers=True,
        device=loaded.spec.resources.device,
        model_type=facts_of(loaded.spec.workload)["model_type"],
    )
    if not isinstance(domain, Fixed):
        raise SpecError(file="--set", field=name, problem="give one value, not a domain")


def measure(
    loaded: LoadedStudy,
    config: TrialConfig,
    *,
    repeats: int = 1,
    memory_cap_gib: float | None | str = "study",
    on_result: Callable[[int, Measurement], None] | None = None,
    launcher: Launcher | None = None,
) -> list[Measurement]:
    """Run ``config`` ``repeats`` times, one after another, on a Ray actor each (as trials run).

    Args:
        memory_cap_gib: ``"study"`` keeps the study's cap; a number or ``None`` overrides it.
        launcher: a started launcher to reuse (it is left running); default: one for this call.
    """
    from explorer.launch import launcher_for

    spec = loaded.spec
    resources = spec.resources
    if memory_cap_gib != "study":
        resources = resources.model_copy(update={"device_memory_gib": memory_cap_gib})
    owns_launcher = launcher is None
    if launcher is None:
        launcher = launcher_for(loaded, output_dir=loaded.output_dir / "measure", resources=resources)
        launcher.start()
    results: list[Measurement] = []
    try:
        for i in range(repeats):
            launcher.submit(TrialJob.for_study(loaded, config, trial_number=i, resources=resources))
            done: list[tuple[int, Measurement]] = []
            while not done:
                done = launcher.wait(timeout_s=1.0)
            results.append(done[0][1])
            if on_result is not None:
                on_result(i, done[0][1])
    finally:
        if owns_launcher:
            launcher.shutdown()
    return results


def none_measured(results: list[Measurement]) -> str | None:
    """One line saying that no repeat produced a measurement, with their outcomes; ``None`` when
    at least one did (``explorer measure`` then exits 0, else 1)."""
    if any(m.outcome is Outcome.OK and m.properties is not None for m in results):
        return None
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in Counter(m.outcome.value for m in results).items())
    repeats = f"{len(results)} repeat" + ("s" if len(results) > 1 else "")
    return f"no measurement: {repeats} ended {outcomes}"


def with_measurement(loaded: LoadedStudy, **update: Any) -> LoadedStudy:
    """``loaded`` with its measurement spec changed (for benchmarks comparing stop rules)."""
    from explorer.spec import MeasurementSpec

    current = loaded.spec.measurement.model_dump(exclude_unset=True)
    measurement = MeasurementSpec.model_validate(current | update)
    return replace(loaded, spec=loaded.spec.model_copy(update={"measurement": measurement}))
