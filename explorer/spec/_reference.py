"""``python -m explorer.spec``: the study file's page (``docs/study-file.md``), its field reference
generated from the models' field docstrings."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from explorer.spec._models import StudySpec
from explorer.spec._objectives import OBJECTIVE_TABLE

__all__ = ["field_docs", "model_section", "study_file_page"]

REGENERATE = ".venv/bin/python -m explorer.spec > docs/study-file.md"
"""The command that writes the page (a test checks that the committed page is its output)."""

TEMPLATE = Path(__file__).resolve().parents[2] / "docs" / "study-file.md.in"
"""The page's hand-written prose (the repository's, not installed): the field reference replaces
its :data:`MARK` line."""
MARK = "<!-- every field, generated from the models: explorer/spec/_reference.py -->\n"

_ROLE = re.compile(r":(?:mod|class|func|data|attr|meth|obj):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def study_file_page() -> str:
    """The whole page: :data:`TEMPLATE` with every section's fields and the objectives at :data:`MARK`."""
    parts = []
    for path, model in _sections(StudySpec, ""):
        parts.append(model_section(model, path))
        if model is StudySpec:
            parts.append(_objectives())
    head, tail = TEMPLATE.read_text().split(MARK)
    return head + "\n".join(parts) + tail


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field's docstring (the string statement after it), read with ``ast`` from the model's
    class and its bases; a field without one is absent."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, [*body.body[1:], None], strict=True):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            docs.pop(stmt.target.id, None)  # a subclass redeclares it: its own docstring or none
            text = (
                after.value.value
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                else None
            )
            if isinstance(text, str):
                docs[stmt.target.id] = inspect.cleandoc(text)
    return docs


def model_section(model: type[BaseModel], path: str) -> str:
    """One mapping's heading, its class docstring and a bullet per field (Markdown)."""
    title = f"`{path}`" if path else "The top level"
    kind = _kind(model)
    if kind is not None:
        title += f" with `kind: {kind}`"
    lines = [f"### {title}", ""]
    if model.__doc__:
        lines += [_markdown(inspect.cleandoc(model.__doc__)), ""]
    docs = field_docs(model)
    for name, info in model.model_fields.items():
        text = f"* `{name}`: {_type(info.annotation, info.metadata)}; {_default(info)}."
        if name in docs:
            text += "\n" + textwrap.indent(_markdown(docs[name]), "  ")
        lines.append(text)
    return "\n".join(lines) + "\n"


def _objectives() -> str:
    rows = [
        "### The objectives (`objective`, `second_objective`)",
        "",
        "| objective | direction | may be | needs | what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    for o in OBJECTIVE_TABLE:
        place = " and ".join(p for p, ok in (("first", o.first), ("second", o.second)) if ok)
        needs = f"`{o.needs}`" if o.needs else "-"
        rows.append(f"| `{o.name}` | {o.direction} | {place} | {needs} | {o.doc} |")
    return "\n".join(rows) + "\n"


def _sections(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """``model`` and every mapping below it, depth first, with their dotted paths."""
    yield path, model
    for name, info in model.model_fields.items():
        for child in _models_in(info.annotation):
            yield from _sections(child, f"{path}.{name}" if path else name)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _kind(model: type[BaseModel]) -> str | None:
    """The one ``kind`` a section of a union has (``launcher``), else ``None``."""
    info = model.model_fields.get("kind")
    args = typing.get_args(info.annotation) if info is not None else ()
    return (
        args[0]
        if info is not None and typing.get_origin(info.annotation) is Literal and len(args) == 1
        else None
    )


def _type(annotation: Any, metadata: list[Any]) -> str:
    """``annotation`` in words, with its bounds."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _type(args[0], [*metadata, *args[1:]])
    words = [b for m in metadata for b in _bounds(m)]
    numeric = " and ".join(w for w in words if w != "not empty")
    bounds = (f" {numeric}" if numeric else "") + (", not empty" if "not empty" in words else "")
    models = _models_in(annotation)
    if models:
        return f"a mapping (`{'` or `'.join(m.__name__ for m in models)}`, below)"
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_type(a, metadata) for a in args if a is not type(None)))
    if origin is Literal:
        values = ", ".join(f"`{_value(a)}`" for a in args)
        return values if len(args) == 1 else f"one of {values}"
    if origin is list:
        return f"list of {_type(args[0], [])}" + bounds
    if origin is dict:
        return f"mapping of {_type(args[0], [])} to {_type(args[1], [])}" + bounds
    names = {bool: "true or false", int: "integer", float: "number", str: "string"}
    return names.get(annotation, "any") + bounds


_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _bounds(m: Any) -> list[str]:
    """A constraint in words (``Field(gt=0)``: ``> 0``; a non-empty list: ``not empty``)."""
    if isinstance(m, FieldInfo):
        return [b for x in m.metadata for b in _bounds(x)]
    if isinstance(m, annotated_types.MinLen) and m.min_length == 1:
        return ["not empty"]
    return [
        f"{sign} {getattr(m, key)}" for key, sign in _BOUNDS if isinstance(getattr(m, key, None), int | float)
    ]


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "defaults below" if isinstance(value, BaseModel) else f"default `{_value(value)}`"
    if info.default is PydanticUndefined:
        return "**required**"
    return "unset by default" if info.default is None else f"default `{_value(info.default)}`"


def _value(v: Any) -> str:
    """A value as YAML writes it (flow style)."""
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def _markdown(text: str) -> str:
    """A docstring's reStructuredText roles and literals as Markdown code."""
    return _LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", text))
