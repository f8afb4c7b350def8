"""The knobs a study tunes, each declared once (:mod:`explorer.knobs._registry`), and what a knob
is (:class:`Knob`). Everything that lists parameters derives from here."""

from explorer.knobs._knob import (
    Axis,
    Condition,
    Knob,
    Needs,
    Rule,
    Value,
    any_value,
    fraction,
    one_of,
    positive,
)
from explorer.knobs._registry import (
    BACKENDS,
    FSDP_SHARDING_STRATEGIES,
    FSDP_VERSIONS,
    LIGER_UNFUSED_LOSS_MODEL_TYPES,
    SHARDING,
    asking_order,
    knob,
    knobs,
    reference,
    register,
    run_options,
)

__all__ = [
    "Axis",
    "BACKENDS",
    "Condition",
    "FSDP_SHARDING_STRATEGIES",
    "FSDP_VERSIONS",
    "Knob",
    "LIGER_UNFUSED_LOSS_MODEL_TYPES",
    "Needs",
    "Rule",
    "SHARDING",
    "Value",
    "any_value",
    "asking_order",
    "fraction",
    "knob",
    "knobs",
    "reference",
    "one_of",
    "positive",
    "register",
    "run_options",
]
