"""``docs/study-file.md`` is what ``python -m explorer.spec`` prints: every field of the study file
with its docstring from ``explorer/spec/_models.py``, and the objectives from their one table."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel, Field

from explorer.spec import OBJECTIVE_TABLE, StudySpec, study_file_page
from explorer.spec._objectives import OBJECTIVES, SECOND_OBJECTIVES
from explorer.spec._reference import REGENERATE, field_docs, model_section

ROOT = Path(__file__).resolve().parents[1]


def test_the_page_is_up_to_date():
    page = (ROOT / "docs" / "study-file.md").read_text()
    assert page == study_file_page(), f"regenerate (prose: docs/study-file.md.in): {REGENERATE}"


def test_the_page_has_every_field_of_every_section_with_its_docstring():
    page = study_file_page()
    seen: set[type[BaseModel]] = set()
    pending: list[type[BaseModel]] = [StudySpec]
    while pending:
        model = pending.pop()
        seen.add(model)
        docs = field_docs(model)
        for name, info in model.model_fields.items():
            assert f"* `{name}`: " in page, f"{model.__name__}.{name}"
            if name in docs:  # its first line, ``literals`` and :role:`names` as Markdown `code`
                first = re.sub(r":[a-z]+:`~?", "`", docs[name].splitlines()[0]).replace("``", "`")
                assert first in page, f"{model.__name__}.{name}"
            pending += [m for m in _models_in(info.annotation) if m not in seen]
    assert len(seen) >= 10, sorted(m.__name__ for m in seen)  # StudySpec and the mappings below it


def _models_in(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


class _Base(BaseModel):
    size: int = Field(default=3, gt=0)
    """How many, at least one."""
    label: str = "x"
    """The base's label."""


class _Child(_Base):
    """A made-up section.

    With a second paragraph."""

    label: str = "y"  # redeclared without a docstring: the base's no longer describes it
    names: list[str] = Field(default_factory=lambda: ["a", "b"], min_length=1)
    """Names, see :mod:`explorer.spec` and ``names``."""
    needed: float
    mode: typing.Literal["fast", "slow"] | None = None
    """``fast`` or ``slow``."""


def test_field_docs_reads_the_statement_after_each_field_through_the_bases():
    assert field_docs(_Child) == {
        "size": "How many, at least one.",
        "names": "Names, see :mod:`explorer.spec` and ``names``.",
        "mode": "``fast`` or ``slow``.",
    }


def test_a_section_gives_each_field_its_type_bounds_default_and_docstring():
    section = model_section(_Child, "a.b")
    assert section.startswith("### `a.b`\n\nA made-up section.\n\nWith a second paragraph.\n")
    assert "* `size`: integer > 0; default `3`.\n  How many, at least one." in section
    assert "* `label`: string; default `y`.\n* `names`" in section
    assert (
        "* `names`: list of string, not empty; default `[a, b]`.\n  Names, see `explorer.spec` and `names`."
        in section
    )
    assert "* `needed`: number; **required**." in section
    assert "* `mode`: one of `fast`, `slow`; unset by default.\n  `fast` or `slow`." in section


def test_the_study_file_takes_exactly_the_declared_objectives():
    objective = StudySpec.model_fields["objective"]
    second = StudySpec.model_fields["second_objective"]
    assert typing.get_args(objective.annotation) == tuple(OBJECTIVES)
    assert typing.get_args(typing.get_args(second.annotation)[0]) == tuple(SECOND_OBJECTIVES)
    assert objective.default == OBJECTIVE_TABLE[0].name
    page = study_file_page()
    for o in OBJECTIVE_TABLE:
        assert f"| `{o.name}` | {o.direction} |" in page
