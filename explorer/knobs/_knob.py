"""What a knob is: one tunable field of a trial's configuration, with everything the rest of
explorer needs to know about it (see :mod:`explorer.knobs._registry` for the knobs themselves)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from explorer.errors import did_you_mean

__all__ = [
    "Axis",
    "Condition",
    "Knob",
    "Needs",
    "Value",
    "any_value",
    "fraction",
    "one_of",
    "positive",
    "Rule",
]

Value = int | float | str | bool
Kind = Literal["int", "float", "bool", "str"]
Check = Callable[[Value], "str | None"]
Config = Any
"""A :class:`~explorer.trial_config.TrialConfig`, typed loosely: that class is built from the
knobs, so this package sits below it and never imports it (not even for type checking)."""
Compare = Callable[[Config, Config], bool]
"""``compare(a, b)``: whether ``a`` is at least ``b`` along one knob (at least as hungry for
memory, or at least as fast), everything else aside."""


class Rule:
    """A :data:`Compare` that reads only the configuration fields :attr:`reads`, so that a search
    comparing thousands of configurations can compare each combination of those fields' values
    once (:func:`explorer.search._frontier._undominated`) instead of calling it for every pair."""

    def __init__(self, compare: Compare, *, reads: tuple[str, ...]) -> None:
        self.compare = compare
        self.reads = reads
        """The fields ``compare`` reads (``tests/test_knobs.py`` checks that no other matters)."""

    def __call__(self, a: Config, b: Config) -> bool:
        return self.compare(a, b)

    def view(self, c: Config) -> tuple[Any, ...]:
        """What the rule sees of ``c``."""
        return tuple(getattr(c, f) for f in self.reads)


def positive(v: Value) -> str | None:
    return (
        None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
        else f"{v!r} must be a positive integer"
    )


def one_of(allowed: tuple[Value, ...]) -> Check:
    names = [str(a) for a in allowed]
    return lambda v: (
        None if v in allowed else f"{v!r} is not one of {list(allowed)}{did_you_mean(str(v), names)}"
    )


def any_value(v: Value) -> str | None:
    return None


def fraction(v: Value) -> str | None:
    """A number in (0, 1]."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1
    return None if ok else f"{v!r} must be a number in (0, 1]"


@dataclass(frozen=True)
class Axis:
    """How a knob's values are ordered by memory per device (or by speed per GPU).

    ``equal``: no known order, two configurations are compared only at the same value (the safe
    choice for a knob whose effect is unknown); ``increasing``: a larger value (``True`` over
    ``False``) needs at least as much; ``decreasing``: a smaller one does; ``ordered``: the
    levels of :attr:`order`, from least to most, where a level is a value or a tuple of values
    that tie (a value outside it only equals itself).
    """

    kind: Literal["equal", "increasing", "decreasing", "ordered"] = "equal"
    order: tuple[Value | tuple[Value, ...], ...] = ()

    def level(self, x: Any) -> int | None:
        """The index of ``x``'s level in :attr:`order` (``None``: not in it)."""
        for i, level in enumerate(self.order):
            if x == level or (isinstance(level, tuple) and x in level):
                return i
        return None

    def at_least(self, x: Any, y: Any) -> bool:
        """Whether value ``x`` is at least value ``y`` along the axis."""
        if x == y:
            return True
        if self.kind == "ordered":
            lx, ly = self.level(x), self.level(y)
            return lx is not None and ly is not None and lx >= ly
        if self.kind == "equal" or x is None or y is None:
            return False
        return bool(x >= y) if self.kind == "increasing" else bool(x <= y)

    def step_down(self, x: Any) -> Any:
        """The value one level below ``x`` on an ``ordered`` axis (``None``: none; the first
        value of a tied level)."""
        i = self.level(x) if self.kind == "ordered" else None
        if not i:
            return None
        below = self.order[i - 1]
        return below[0] if isinstance(below, tuple) else below


EQUAL = Axis()


@dataclass(frozen=True)
class Condition:
    """When a knob applies: ``parent`` (another knob, or a fact of the workload such as
    ``method``) has a value that passes ``test``. The three phrases make the error lines."""

    parent: str
    test: Callable[[Any], bool]
    needs: str
    """What the knob needs, e.g. ``number_gpus > 1``."""
    never: str
    """Why it can never apply, e.g. ``number_gpus is only 1``."""
    may: str
    """When it may apply, e.g. ``number_gpus can exceed 1``."""
    opened_by: tuple[str, Value] | None = None
    """Where ``test`` fails, the knob still applies where another knob can take a value
    (``("fsdp_cpu_offload", True)``: the backend on one GPU, for FSDP with CPU offload): in a
    search space that names the knob and whose domain of the other holds the value; in a
    configuration, where the other has it."""


@dataclass(frozen=True)
class Needs:
    """What one value of a knob needs of the place it runs. A search space on resources that
    cannot give it is refused (``resources.device: cpu`` for a CUDA-only value; a model type
    outside :attr:`model_types`); the worker checks again where it runs (the module imports)."""

    cuda: bool = False
    """Only on a CUDA device."""
    module: str | None = None
    """A Python module the training processes must import (``flash_attn``)."""
    model_types: frozenset[str] | None = None
    """The transformers ``model_type`` values it supports (``None``: every one)."""
    why: str | None = None
    """Why it needs CUDA, where that is not plain (said in the line that refuses it)."""

    def unmet(self, value: Any, *, device: str | None, model_type: str | None) -> str | None:
        """Why ``value`` cannot run on ``device`` (``cuda``/``cpu``; ``auto``/``None``: not
        known yet) for ``model_type`` (``None``: not known), or ``None``."""
        if self.cuda and device == "cpu":
            because = f" ({self.why})" if self.why else ""
            return f"{value!r} needs a CUDA device{because}, but resources.device is cpu"
        if self.model_types is not None and model_type is not None and model_type not in self.model_types:
            known = sorted(self.model_types)
            return (
                f"{value!r} does not support model_type {model_type!r} ({len(known)} model types "
                f"do: {', '.join(known[:8])}, ...)"
            )
        return None

    def missing_module(self, value: Any) -> str | None:
        """Why ``value`` cannot run in this process: its module does not import (``None``: it
        does, or it needs none)."""
        import importlib.util

        if self.module is None or importlib.util.find_spec(self.module) is not None:
            return None
        return (
            f"{value!r} needs the Python package {self.module!r}, which the training processes cannot import"
        )


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One tunable field of :class:`~explorer.trial_config.TrialConfig`, declared once."""

    name: str
    """The field's name: the search-space parameter, the ``--set`` name, the export column."""
    kind: Kind
    """The type of its values: ``int``, ``float``, ``bool`` or ``str``."""
    doc: str
    """One line for the study-file reference and ``--help``."""
    required: bool = False
    """A search space must give it wherever it applies (it has no default); a configuration
    cannot be made without it, unless it has a condition (then it takes :attr:`inactive`)."""
    default: Value | None = None
    """The value of a configuration that does not name it (an old stored trial, an old table
    row, a search space that leaves it out); ``None``: no value (the run's own default)."""
    default_from: Callable[[Any], Value | None] | None = None
    """A search-space default taken from the workload (:class:`~explorer.spec.WorkloadSpec`),
    e.g. the sequence length; wins over :attr:`default` in a space."""
    measure_default: Value | None = None
    """What ``explorer measure`` takes for it when it applies and neither ``--set`` nor the
    study's space gives it (a space must name it: it has no default)."""
    check: Check = any_value
    """A value's problem (``None``: none), a line a user reads."""
    check_transformers: Check | None = None
    """A check that imports transformers (seconds): run only where the model is checked too
    (``validate``, ``optimize``, ``measure``), not by the commands that read a stored study."""
    when: Condition | None = None
    """When the knob applies (``None``: always). Its :attr:`parent` must come first."""
    inactive: Value | None = None
    """Its value where it does not apply (``NONE`` for the backend of one GPU, 1 node)."""
    asked_first: bool = False
    """Asked before the others: the knobs that shape the job (GPUs, nodes, backend). The rest
    are asked in registry order."""
    compare_as: Callable[[Config], Any] | None = None
    """What dominance and the neighbour model compare instead of the value (the per-device
    batch for ``batch_size``)."""
    memory: Axis | Compare = EQUAL
    """Its memory direction (OOM inference): an :class:`Axis`, or a comparison of two whole
    configurations where the direction depends on others (GPUs under sharding)."""
    speed: Axis | Compare = EQUAL
    """Its role in the throughput prior: an :class:`Axis` of speed per GPU, or a comparison."""
    trade: bool | Axis = False
    """Local search trades memory along it for batch size: a bool knob (``True``; its
    :attr:`memory` axis says which value saves memory) flips to save memory with a larger batch,
    or back with a smaller one (checkpointing); a str knob (an ordered :class:`Axis` of memory)
    steps down it with a larger batch (one step more sharding)."""
    feature: str | None = ""
    """The neighbour model's feature it feeds (knobs naming one feature make a tuple); ``""``:
    its own name; ``None``: none."""
    label: Callable[[Any, Config], str | None] | None = None
    """Its short form in progress lines, status and report (``None``: ``name=value``, shown
    only when not at its default)."""
    training_args: str | None = None
    """The ``TrainingArguments`` keyword it sets, when it applies (the worker maps the knobs
    that shape the job itself)."""
    model_kwarg: str | None = None
    """The keyword of the model's ``from_config``/``from_pretrained`` it sets, when it applies."""
    data_option: str | None = None
    """The keyword of the data pipeline it sets (``explorer.worker._data.collator_for``)."""
    settle: Callable[[Any, Mapping[str, Any]], Any] | None = None
    """The value a configuration holds for a given one, given the knobs before it in the
    registry (``DDP`` on one GPU is one process: ``NONE``); ``None``: the value itself."""
    needs: Mapping[Any, Needs] = field(default_factory=dict)
    """What some of its values need of the device, the installed packages or the model
    (``{"flash_attention_2": Needs(cuda=True, module="flash_attn")}``)."""
    efficiency: Mapping[Any, float] = field(default_factory=dict)
    """A prior multiplier of the compute efficiency by value (unlisted: 1), for the search's
    first-principles speed estimate (:mod:`explorer.search._physics`): a few percent, which the
    measured trials overturn where it is wrong."""
    state_bytes: Mapping[Any, float] = field(default_factory=dict)
    """Optimizer-state bytes per trainable parameter by value, for the search's memory estimate
    (unlisted: two moments as wide as the weights)."""
    activation_share: Mapping[Any, float] = field(default_factory=dict)
    """A multiplier of the saved activations by value (unlisted: 1), for the search's memory
    estimate (:mod:`explorer.search._physics`)."""
    activation_share_unless: str | None = None
    """A bool knob that, when on, leaves :attr:`activation_share` out: its kernels already keep
    only what this knob's share would save (``None``: the share always applies)."""
    activation_bytes: Mapping[Any, float] = field(default_factory=dict)
    """Bytes a token, layer and hidden unit that a layer saves more (negative: fewer) by value
    (unlisted: 0), added to the search's :data:`explorer.search._physics.ACTIVATION_BASE`."""
    mlp_activation_share: Mapping[Any, float] = field(default_factory=dict)
    """A multiplier of the activations a gated MLP saves (its intermediate-width tensors) by value
    (unlisted: 1), for the search's memory estimate (:mod:`explorer.search._physics`)."""
    step_copies: Mapping[Any, float] = field(default_factory=dict)
    """Copies of the trainable weights that the optimizer step holds as temporaries, by value
    (unlisted: none), for the search's memory estimate."""

    def unmet(self, value: Any, *, device: str | None, model_type: str | None) -> str | None:
        """Why ``value`` cannot run on ``device`` for ``model_type`` (see :meth:`Needs.unmet`)."""
        needs = self.needs.get(value)
        return None if needs is None else needs.unmet(value, device=device, model_type=model_type)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"knob name {self.name!r} is not an identifier")
        if self.required and self.default is not None:
            raise ValueError(f"knob {self.name}: a required knob has no default")
        if self.default is not None and self.check(self.default) is not None:
            raise ValueError(f"knob {self.name}: default {self.default!r}: {self.check(self.default)}")

    def applies(
        self, values: Mapping[str, Any], facts: Mapping[str, Any], domains: Mapping[str, Any] | None = None
    ) -> bool:
        """Whether the knob applies, given the knobs decided so far and the workload's facts
        (``domains``: a search space's, where it is building a configuration; see
        :attr:`Condition.opened_by`)."""
        if self.when is None:
            return True
        parent = values[self.when.parent] if self.when.parent in values else facts.get(self.when.parent)
        return bool(self.when.test(parent)) or self.opened(values, domains)

    def opened(self, values: Mapping[str, Any], domains: Mapping[str, Any] | None) -> bool:
        """Whether its condition's :attr:`~Condition.opened_by` holds: in ``domains`` (a search
        space's, each with ``values``), or else in ``values`` (a configuration's)."""
        by = self.when.opened_by if self.when is not None else None
        if by is None:
            return False
        other, value = by
        if domains is None:
            return bool(values.get(other) == value)
        return self.name in domains and other in domains and value in domains[other].values

    def coerce(self, value: Any) -> Value:
        """``value`` as the knob's kind."""
        return {"int": int, "float": float, "bool": bool, "str": str}[self.kind](value)

    def compared(self, config: Config) -> Any:
        """What dominance compares of ``config`` along this knob."""
        return self.compare_as(config) if self.compare_as is not None else getattr(config, self.name)

    def memory_at_least(self, a: Config, b: Config) -> bool:
        """Whether ``a`` needs at least ``b``'s memory along this knob."""
        if isinstance(self.memory, Axis):
            return self.memory.at_least(self.compared(a), self.compared(b))
        return self.memory(a, b)

    def speed_at_least(self, a: Config, b: Config) -> bool:
        """Whether ``a`` is expected at least as fast per GPU as ``b`` along this knob."""
        if isinstance(self.speed, Axis):
            return self.speed.at_least(self.compared(a), self.compared(b))
        return self.speed(a, b)

    def short(self, config: Config) -> str | None:
        """Its part of a configuration's short form (``None``: nothing to show)."""
        value = getattr(config, self.name)
        if self.label is not None:
            return self.label(value, config)
        return None if value == self.default or value is None else f"{self.name}={value}"
