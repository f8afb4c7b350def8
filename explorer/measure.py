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
from explorer.measurement import Measurement, Outcome
from explorer.spec import LoadedStudy, read_yaml
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    from explorer.launch import Launcher

__all__ = ["config_from_cli", "measure", "none_measured", "with_measurement"]


def config_from_cli(loaded: LoadedStudy, *, sets: list[str], config_file: str | None) -> TrialConfig:
    """A TrialConfig from ``--config FILE`` and ``--set name=value`` (the latter win).

    Unset knobs take the workload's defaults; each value is checked like a search-space value.

    Raises:
        SpecError: an unknown name, a bad value, or a missing required knob.
    """
    from explorer.space import PARAMETERS

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
        spec = PARAMETERS.get(name)
        if spec is None:
            raise SpecError(file="--set", field=name, problem=f"unknown; known: {', '.join(PARAMETERS)}")
        kind_ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
        }
        if not kind_ok.get(spec.kind, isinstance(value, str)):
            raise SpecError(file="--set", field=name, problem=f"{value!r} is not a {spec.kind}")
        problem = spec.check(value)
        if problem is None and spec.check_transformers is not None:
            problem = spec.check_transformers(value)
        if problem:
            raise SpecError(file="--set", field=name, problem=problem)
    for name in ("batch_size", "number_gpus"):
        if name not in values:
            raise SpecError(file="--set", field=name, problem="required")
    workload = loaded.spec.workload
    gpus = values["number_gpus"]
    backend = values.get("distributed_backend", "DDP" if gpus > 1 else "NONE")
    fsdp = backend == "FSDP"
    return TrialConfig(
        batch_size=values["batch_size"],
        number_gpus=gpus,
        distributed_backend=backend,
        gradient_checkpointing=values.get("gradient_checkpointing", False),
        model_max_length=values.get("model_max_length", workload.model_max_length),
        fsdp_version=values.get("fsdp_version", 2) if fsdp else None,
        fsdp_sharding_strategy=values.get("fsdp_sharding_strategy", "FULL_SHARD") if fsdp else None,
        gradient_accumulation_steps=values.get("gradient_accumulation_steps", 1),
        lora_r=values.get("lora_r", workload.method.r) if workload.method.kind == "lora" else None,
        optim=values.get("optim", "adamw_torch"),
        torch_compile=values.get("torch_compile", False),
    )


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
