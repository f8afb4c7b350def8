"""What a knob is: one tunable field of a trial's configuration, with everything the rest of
explorer needs to know about it (see :mod:`explorer.knobs._registry` for the knobs themselves)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Axis",
    "Condition",
    "Knob",
    "Value",
    "any_value",
    "one_of",
    "positive",
]

Value = int | float | str | bool
Kind = Literal["int", "bool", "str"]
Check = Callable[[Value], "str | None"]
Config = Any
"""A :class:`~explorer.trial_config.TrialConfig`, typed loosely: that class is built from the
knobs, so this package sits below it and never imports it (not even for type checking)."""
Compare = Callable[[Config, Config], bool]
"""``compare(a, b)``: whether ``a`` is at least ``b`` along one knob (at least as hungry for
memory, or at least as fast), everything else aside."""


def positive(v: Value) -> str | None:
    return (
        None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
        else f"{v!r} must be a positive integer"
    )


def one_of(allowed: tuple[Value, ...]) -> Check:
    return lambda v: None if v in allowed else f"{v!r} is not one of {list(allowed)}"


def any_value(v: Value) -> str | None:
    return None


@dataclass(frozen=True)
class Axis:
    """How a knob's values are ordered by memory per device (or by speed per GPU).

    ``equal``: no known order, two configurations are compared only at the same value (the safe
    choice for a knob whose effect is unknown); ``increasing``: a larger value (``True`` over
    ``False``) needs at least as much; ``decreasing``: a smaller one does; ``ordered``: the
    values of :attr:`order`, from least to most (a value outside it only equals itself).
    """

    kind: Literal["equal", "increasing", "decreasing", "ordered"] = "equal"
    order: tuple[Value, ...] = ()

    def at_least(self, x: Any, y: Any) -> bool:
        """Whether value ``x`` is at least value ``y`` along the axis."""
        if x == y:
            return True
        if self.kind == "ordered":
            return x in self.order and y in self.order and self.order.index(x) >= self.order.index(y)
        if self.kind == "equal" or x is None or y is None:
            return False
        return bool(x >= y) if self.kind == "increasing" else bool(x <= y)

    def step_down(self, x: Any) -> Any:
        """The value one step below ``x`` on an ``ordered`` axis (``None``: none)."""
        if self.kind != "ordered" or x not in self.order or self.order.index(x) == 0:
            return None
        return self.order[self.order.index(x) - 1]


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


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One tunable field of :class:`~explorer.trial_config.TrialConfig`, declared once."""

    name: str
    """The field's name: the search-space parameter, the ``--set`` name, the export column."""
    kind: Kind
    """The type of its values: ``int``, ``bool`` or ``str``."""
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

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"knob name {self.name!r} is not an identifier")
        if self.required and self.default is not None:
            raise ValueError(f"knob {self.name}: a required knob has no default")
        if self.default is not None and self.check(self.default) is not None:
            raise ValueError(f"knob {self.name}: default {self.default!r}: {self.check(self.default)}")

    def applies(self, values: Mapping[str, Any], facts: Mapping[str, Any]) -> bool:
        """Whether the knob applies, given the knobs decided so far and the workload's facts."""
        if self.when is None:
            return True
        parent = values[self.when.parent] if self.when.parent in values else facts.get(self.when.parent)
        return bool(self.when.test(parent))

    def coerce(self, value: Any) -> Value:
        """``value`` as the knob's kind."""
        return {"int": int, "bool": bool, "str": str}[self.kind](value)

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
