"""Parameter domains: a fixed value, unordered choices, or ordered numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

__all__ = ["Categorical", "Domain", "Fixed", "Ordered"]

Value = int | float | str | bool
MAX_DOMAIN_VALUES = 100_000
"""Most values one ``low``/``high`` domain may expand to (a typo like ``high: 1e12`` must not hang)."""


@dataclass(frozen=True)
class Fixed:
    """A parameter held at one value: never suggested."""

    value: Value

    @property
    def values(self) -> tuple[Value, ...]:
        return (self.value,)

    def suggest(self, trial: optuna.Trial, name: str) -> Value:
        return self.value


@dataclass(frozen=True)
class Categorical:
    """Unordered choices (backends, strategies, booleans)."""

    values: tuple[Value, ...]

    def suggest(self, trial: optuna.Trial, name: str) -> Value:
        return trial.suggest_categorical(name, list(self.values))  # type: ignore[return-value]

    def encode(self, name: str, value: Value) -> dict[str, Value]:
        return {name: value}


@dataclass(frozen=True)
class Ordered:
    """Ordered integers, searched as an ordered (integer) Optuna parameter, never as categories.

    The Optuna parameter is a 1:1 encoding of the values:

    * an arithmetic progression ``a, a+d, ...`` is the parameter itself (``suggest_int`` with step d);
    * powers of two are suggested as ``log2_<name>`` (so 1..64 becomes 0..6);
    * any other sorted list is suggested by position as ``<name>_index``.
    """

    values: tuple[int, ...]

    @property
    def _step(self) -> int | None:
        v = self.values
        if len(v) == 1:
            return 1
        d = v[1] - v[0]
        return d if all(b - a == d for a, b in zip(v, v[1:], strict=False)) else None

    @property
    def _pow2(self) -> bool:
        return all(x > 0 and x & (x - 1) == 0 for x in self.values) and all(
            b == 2 * a for a, b in zip(self.values, self.values[1:], strict=False)
        )

    def param_name(self, name: str) -> str:
        """Name of the Optuna parameter that encodes this domain."""
        if self._step is not None:
            return name
        return f"log2_{name}" if self._pow2 else f"{name}_index"

    def suggest(self, trial: optuna.Trial, name: str) -> Value:
        v = self.values
        step = self._step
        if step is not None:
            return trial.suggest_int(name, v[0], v[-1], step=step)
        if self._pow2:
            e = trial.suggest_int(f"log2_{name}", int(math.log2(v[0])), int(math.log2(v[-1])))
            return 2**e
        return v[trial.suggest_int(f"{name}_index", 0, len(v) - 1)]

    def encode(self, name: str, value: Value) -> dict[str, Value]:
        """The Optuna parameter (name and value) that :meth:`suggest` would record for ``value``."""
        pname = self.param_name(name)
        if pname == name:
            return {name: value}
        if pname.startswith("log2_"):
            return {pname: int(value).bit_length() - 1}
        return {pname: self.values.index(int(value))}


Domain = Fixed | Categorical | Ordered


def parse_domain(raw: Any, *, kind: str) -> Domain:
    """Build a domain from its YAML form; raises ``ValueError`` with a short reason.

    Forms: a scalar (fixed), ``{choices: [...]}``, ``{values: [...]}`` (ordered, ints only) or
    ``{low: a, high: b, step: d}`` / ``{low: a, high: b, log2: true}`` (ordered ints).

    Args:
        raw: The YAML value.
        kind: ``"int"``, ``"float"``, ``"bool"`` or ``"str"``: the type every value must have.
    """

    def check(value: Any) -> Value:
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{value!r} is not an integer")
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{value!r} is not a number")
            return float(value)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{value!r} is not true/false")
        elif not isinstance(value, str):
            raise ValueError(f"{value!r} is not a string")
        return value

    if not isinstance(raw, dict):
        if isinstance(raw, list):
            raise ValueError("a list needs a key: use {choices: [...]} or {values: [...]}")
        return Fixed(check(raw))
    keys = set(raw)
    if keys == {"choices"}:
        choices = raw["choices"]
        if not isinstance(choices, list) or not choices:
            raise ValueError("choices is empty; give at least one value")
        vals = tuple(check(c) for c in choices)
        if len(set(vals)) != len(vals):
            raise ValueError("choices has duplicates")
        return Fixed(vals[0]) if len(vals) == 1 else Categorical(vals)
    if kind != "int":
        raise ValueError("use a single value or {choices: [...]}")
    if keys == {"values"}:
        values = raw["values"]
        if not isinstance(values, list) or not values:
            raise ValueError("values is empty; give at least one value")
        ints = tuple(sorted(int(check(v)) for v in values))
        if len(set(ints)) != len(ints):
            raise ValueError("values has duplicates")
        return Fixed(ints[0]) if len(ints) == 1 else Ordered(ints)
    if "low" in keys and "high" in keys and keys <= {"low", "high", "step", "log2"}:
        low, high = int(check(raw["low"])), int(check(raw["high"]))
        if low > high:
            raise ValueError(f"low ({low}) is greater than high ({high}): the domain is empty")
        if not isinstance(raw.get("log2", False), bool):
            raise ValueError(f"log2 must be true or false, not {raw['log2']!r}")
        if raw.get("log2"):
            if "step" in keys:
                raise ValueError("give step or log2, not both")
            if low <= 0:
                raise ValueError("log2 needs low >= 1")
            ints = tuple(2**e for e in range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1))
            if not ints:
                raise ValueError(f"no power of two between {low} and {high}: the domain is empty")
        else:
            step = int(check(raw.get("step", 1)))
            if step <= 0:
                raise ValueError("step must be positive")
            if (high - low) // step + 1 > MAX_DOMAIN_VALUES:
                raise ValueError(
                    f"low ({low}) to high ({high}) in steps of {step} is more than {MAX_DOMAIN_VALUES} values"
                )
            ints = tuple(range(low, high + 1, step))
        return Fixed(ints[0]) if len(ints) == 1 else Ordered(ints)
    raise ValueError(
        f"unknown domain keys {sorted(keys)}; use choices, values, or low/high with step or log2"
    )
