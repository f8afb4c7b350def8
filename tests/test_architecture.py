"""The shape of the package: no import cycle, ``spec`` a leaf, each knob named in few files.

Imports are read with ``ast`` from every module of ``explorer/``: module-level, function-level
(lazy) and ``if TYPE_CHECKING:`` imports alike (a type-only import is a dependency too).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "explorer"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(node: ast.AST, module: str, package: bool) -> Iterator[str]:
    """The explorer modules ``node`` imports (for type checking too)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            yield from (a.name for a in child.names if a.name.split(".")[0] == "explorer")
        elif isinstance(child, ast.ImportFrom):
            base = module.split(".") if package else module.split(".")[:-1]
            target = (
                ".".join([*base[: len(base) - child.level + 1], *([child.module] if child.module else [])])
                if child.level
                else child.module or ""
            )
            if target.split(".")[0] == "explorer":
                yield target
        yield from _imports(child, module, package)


def _graph(unit: int | None) -> dict[str, set[str]]:
    """``{importer: imported}`` between modules (``unit=None``) or between the first ``unit``
    dotted parts (``2``: explorer's packages and top-level modules)."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module(path)
        for target in _imports(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            a, b = (
                (module, target)
                if unit is None
                else (".".join(module.split(".")[:unit]), ".".join(target.split(".")[:unit]))
            )
            if a != b and b != "explorer":
                edges.setdefault(a, set()).add(b)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


@pytest.mark.parametrize("unit", [None, 2], ids=["modules", "packages"])
def test_no_import_cycle(unit):
    cycle = _cycle(_graph(unit))
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_spec_is_a_leaf():
    """The typed study file imports nothing of explorer's above it."""
    allowed = {"explorer.errors", "explorer.paths", "explorer.secrets", "explorer.spec"}
    used = {b for a, targets in _graph(2).items() if a == "explorer.spec" for b in targets}
    assert used <= allowed, sorted(used - allowed)


@pytest.mark.parametrize("name", ["torch_compile", "optim", "gradient_accumulation_steps"])
def test_a_knob_is_named_in_few_files(name):
    """A knob is declared once: its name appears in the registry, the first key's order and at
    most one more file (the worker, where the run needs it), as ``grep -rlw NAME explorer``."""
    word = re.compile(rf"\b{name}\b")
    files = sorted(
        str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py") if word.search(p.read_text())
    )
    assert len(files) <= 3, files
