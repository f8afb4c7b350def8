"""No function or method of the package is longer than a screenful or two: a long one is split
into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "explorer"
MAX_LINES = 80
"""From ``def`` to the function's last line, decorators aside, docstring included."""


def _long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    where = path.relative_to(root.parent).as_posix()
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines():
    long = _long_functions(PACKAGE, MAX_LINES)
    assert not long, f"functions over {MAX_LINES} lines:\n" + "\n".join(long)


def test_the_check_finds_a_long_function(tmp_path):
    package = tmp_path / "explorer"
    package.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES))
    (package / "long.py").write_text("class C:\n    def m(self):\n" + body)
    (package / "short.py").write_text("def f():\n    return 1\n")
    assert _long_functions(package, MAX_LINES) == [f"explorer/long.py:2 m ({MAX_LINES + 1} lines)"]
