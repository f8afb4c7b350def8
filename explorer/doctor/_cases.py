"""Which configuration checks each value of each knob of a study's space on one node.

Every value gets a case: the study's cheapest configuration (the smallest batch, sequence length
and GPU count, each other knob at its default) with that value put in, its conditions met (an
``fsdp_version`` brings FSDP and two GPUs along) and the validity rules kept. A value the node
cannot take gets no configuration but the reason: one its needs name (CUDA, a package that does
not import, a model type), which ``optimize`` then treats as invalid on this node; or one of the
node's size (more GPUs than it has, several nodes), which says nothing against the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from explorer.knobs import Knob, asking_order, knob, knobs
from explorer.space import SearchSpace
from explorer.spec import ResourcesSpec
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

__all__ = ["ALONE", "Case", "Node", "Run", "group_cases", "plan_cases", "unmet_here"]


@dataclass(frozen=True, kw_only=True)
class Node:
    """What the doctor's node offers the trials."""

    device: str
    """``cuda`` or ``cpu``: where this node's ranks train."""
    gpus: int
    """GPUs one trial may use here (CUDA devices, or the study's logical GPUs on the CPU)."""
    missing: Mapping[str, str] = field(default_factory=dict)
    """Optional modules that do not import here, each with its first error line."""
    model_type: str | None = None
    """The workload's transformers ``model_type`` (``None``: not known before the model loads)."""


@dataclass(frozen=True, kw_only=True)
class Case:
    """One value of one knob, and the configuration that checks it (``None``: not applicable)."""

    knob: str
    value: Any
    config: TrialConfig | None = None
    reason: str | None = None
    """Why the value is not applicable here."""
    blocks: bool = False
    """The node cannot run the value at all (``optimize`` records it invalid on this node)."""


def unmet_here(k: Knob, value: Any, node: Node) -> str | None:
    """Why this node cannot run ``value`` of ``k`` (its declared needs), or ``None``."""
    needs = k.needs.get(value)
    if needs is None:
        return None
    problem = needs.unmet(value, device=node.device, model_type=node.model_type)
    if problem:
        return problem.replace("resources.device is cpu", "this node trains on the CPU")
    if needs.module and needs.module in node.missing:
        return (
            f"{value!r} needs the Python package {needs.module!r}, which does not import here: "
            f"{node.missing[needs.module]}"
        )
    return None


def _base(space: SearchSpace, node: Node) -> dict[str, Any]:
    """The cheapest value of each knob the space holds that this node can take."""
    picks: dict[str, Any] = {}
    for name, domain in space.domains.items():
        k = knob(name)
        values = [v for v in domain.values if unmet_here(k, v, node) is None] or list(domain.values)
        if k.kind == "int":
            picks[name] = min(values)
            continue
        preferred = [p for p in (k.default, k.measure_default) if p is not None and p in values]
        picks[name] = preferred[0] if preferred else values[0]
    return picks


def _build(space: SearchSpace, picks: Mapping[str, Any], want: Mapping[str, Any]) -> TrialConfig:
    """The configuration of ``picks``, conditions applied (as the space builds one), at the
    smallest batch of the space that its GPUs divide."""
    values: dict[str, Any] = {}
    for k in asking_order():
        if not k.applies(values, space.facts, space.domains):
            values[k.name] = k.inactive
        elif k.name in space.domains:
            values[k.name] = k.coerce(picks[k.name])
        else:
            values[k.name] = k.default
    batches = sorted(v for v in space.domains["batch_size"].values if v % max(values["number_gpus"], 1) == 0)
    if batches and "batch_size" not in want:
        values["batch_size"] = batches[0]
    return TrialConfig(**values)


def _realize(space: SearchSpace, base: Mapping[str, Any], want: dict[str, Any]) -> TrialConfig | None:
    """A configuration with every value of ``want``, parents chosen so that each applies."""
    config = _build(space, {**base, **want}, want)
    for name, value in want.items():
        if getattr(config, name) == value:
            continue
        when = knob(name).when
        if when is None or when.parent not in space.domains:
            return None
        if when.parent in want:  # its parent does not apply either: settled through the parent
            continue
        for candidate in space.domains[when.parent].values:
            if when.test(candidate):
                found = _realize(space, base, {**want, when.parent: candidate})
                if found is not None:
                    return found
        return None
    return config if all(getattr(config, n) == v for n, v in want.items()) else None


def _valid(
    space: SearchSpace, base: Mapping[str, Any], want: dict[str, Any], resources: ResourcesSpec, node: Node
) -> tuple[TrialConfig | None, str | None]:
    """A valid configuration with ``want`` that fits this node (changing one other knob if need
    be), else the reason."""
    config = _realize(space, base, want)
    if config is None:
        return None, "no configuration of the space lets it apply"
    too_big = _too_big(config, node)
    if too_big is not None:
        return None, too_big
    reason = invalid_reason(config, resources)
    if reason is None and _runs_here(config, node):
        return config, None
    for name, domain in space.domains.items():
        for other in domain.values if name not in want else ():
            if other != getattr(config, name):
                changed = _realize(space, base, {**want, name: other})
                if changed is None or _too_big(changed, node) is not None:
                    continue
                if invalid_reason(changed, resources) is None and _runs_here(changed, node):
                    return changed, None
    return None, f"every configuration near it is invalid: {reason}"


def _runs_here(config: TrialConfig, node: Node) -> bool:
    """Whether this node can take every value of ``config`` (a neighbour chosen to make a value
    valid, one-GPU FSDP with offload say, may hold one it cannot)."""
    return all(unmet_here(k, getattr(config, k.name), node) is None for k in knobs())


def _too_big(config: TrialConfig, node: Node) -> str | None:
    if config.number_nodes > 1:
        return f"a trial over {config.number_nodes} nodes; the doctor runs on one node"
    if config.number_gpus > node.gpus:
        return f"a trial of {config.number_gpus} GPUs; this node has {node.gpus}"
    return None


def _not_run(name: str, value: Any, base: Mapping[str, Any], resources: ResourcesSpec) -> str | None:
    """Why the doctor leaves a value out on purpose (``None``: it checks it)."""
    if name == "batch_size" and value != base["batch_size"]:
        return f"the doctor runs the smallest batch ({base['batch_size']}); a batch's memory is the search's to learn"
    if name == "gpu_model" and resources.model_of(str(value)) != resources.model_of(None):
        return f"another node type ({value}): run the doctor on one of its nodes"
    return None


def plan_cases(space: SearchSpace, resources: ResourcesSpec, node: Node) -> list[Case]:
    """One case per value of each knob of ``space``, in the knobs' registry order."""
    base = _base(space, node)
    out: list[Case] = []
    for k in knobs():
        for value in space.domains[k.name].values if k.name in space.domains else ():
            unmet = unmet_here(k, value, node)
            if unmet is not None:
                out.append(Case(knob=k.name, value=value, reason=unmet, blocks=True))
                continue
            reason = _not_run(k.name, value, base, resources)
            config = None
            if reason is None:
                config, reason = _valid(space, base, {k.name: value}, resources, node)
            out.append(Case(knob=k.name, value=value, config=config, reason=reason))
    return out


ALONE = frozenset(k.name for k in knobs() if k.feature == "compile")
"""Knobs whose values each get a run of their own (a compiled run is long: nothing rides along)."""


@dataclass(kw_only=True)
class Run:
    """One smoke run: a configuration that holds several cases' values at once."""

    want: dict[str, Any]
    config: TrialConfig
    cases: list[Case]


def group_cases(cases: list[Case], space: SearchSpace, resources: ResourcesSpec, node: Node) -> list[Run]:
    """The runs that check every applicable case, few: each value joins the first run whose
    configuration can take it as well (a valid configuration, on this node). A run that fails
    is split again into one run per value (:func:`explorer.doctor._run.run_doctor`)."""
    base = _base(space, node)
    runs: list[Run] = []
    for case in cases:
        if case.config is None:
            continue
        placed = False
        for run in runs if case.knob not in ALONE else ():
            if case.knob in run.want or ALONE & run.want.keys():
                continue
            config, _ = _valid(space, base, {**run.want, case.knob: case.value}, resources, node)
            if config is not None:
                run.want[case.knob] = case.value
                run.config = config
                run.cases.append(case)
                placed = True
                break
        if not placed:
            runs.append(Run(want={case.knob: case.value}, config=case.config, cases=[case]))
    return runs
