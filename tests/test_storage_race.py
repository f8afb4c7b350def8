"""Several processes open one fresh sqlite study file at the same moment (``optimize`` and a
reader such as ``explorer status``): Optuna's schema is created once and every one opens it."""

from __future__ import annotations

import multiprocessing
import time


def _open(url: str, start: float) -> str:
    from explorer.study._storage import open_storage

    while time.time() < start:  # all processes race for the first CREATE TABLE
        pass
    try:
        open_storage(url)
    except Exception as exc:  # reported to the test, which fails on it
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_processes_opening_a_fresh_file_at_once_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        for round_ in range(3):
            url = f"sqlite:///{tmp_path}/race{round_}.db"
            start = time.time() + 4  # after the spawned interpreters have imported explorer
            results = pool.starmap(_open, [(url, start)] * 6)
            assert results == ["ok"] * 6, results
