"""The optimize loop's own cost per trial (ask, tell, storage, inference, local search), on a
replayed table through a sqlite file (or PostgreSQL), so that what is left is explorer and Optuna.

The study is ``benchmarks/search_studies/granite-3.1-2b-wide.yaml``: 500 counted trials over the
762 configurations of ``tables/model-granite-3.1-2b-wide.csv`` (``when_converged: explore``, so
that TPE's repeats do not stop it early). The launcher's own time (table lookups) is measured
around its calls and taken out. Issue 26's target: 50 ms an Optuna trial. Keep the machine
otherwise idle.

    .venv/bin/python benchmarks/optuna_overhead.py [--n-trials 500] [--storage URL | --postgres] [--out JSON]
        [--against CHECKOUT [--rounds 2]] [--study YAML --table CSV] [--search walk|default]

``--against`` measures another checkout's code (e.g. ``git worktree add /tmp/ref d256559``) beside
this one: each round runs the reference, then this tree, each in a process of its own with that
tree's ``explorer`` first on ``PYTHONPATH``, on the same study and table (this tree's), with the
load average before and after. ``--out`` then holds this tree's lowest run (its raw figures at the
top level) and every run under ``paired``. ``--postgres`` starts a throwaway PostgreSQL server on
127.0.0.1 (as the tests do: ``tests/_postgres.py``), a database for each run.

The JSON holds the raw figures (wall and launcher seconds, trials by status, each trial's start
and end, the SQL statements and write transactions the run made); ``tests/test_benchmark_results.py``
recomputes the per-trial figures from them.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "optuna_overhead.json"
STUDY = ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b-wide.yaml"
TABLE = ROOT / "benchmarks" / "results" / "tables" / "model-granite-3.1-2b-wide.csv"
STORAGE_ENV = "EXPLORER_OVERHEAD_STORAGE"
"""How a run is handed its storage URL (kept off the command line: it may carry a password)."""


class TimedLauncher:
    """The study's real launcher, with the seconds spent inside its calls added up."""

    def __init__(self, inner) -> None:  # noqa: ANN001 - any Launcher
        self.inner = inner
        self.seconds = 0.0

    def __getattr__(self, name: str):  # noqa: ANN204
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            started = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


def count_statements() -> collections.Counter:
    """Every SQL statement any engine runs from now on, by its verb, and the transactions that
    wrote (``write_commits``): figures that do not depend on the machine's load."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts: collections.Counter = collections.Counter()

    @event.listens_for(Engine, "before_cursor_execute")
    def statement(conn, cursor, sql, parameters, context, executemany) -> None:  # noqa: ANN001
        verb = sql.lstrip().split(None, 1)[0].upper()
        counts[verb] += 1
        if verb in ("INSERT", "UPDATE", "DELETE"):
            conn.info["wrote"] = True

    @event.listens_for(Engine, "commit")
    def commit(conn) -> None:  # noqa: ANN001
        counts["write_commits"] += bool(conn.info.pop("wrote", False))

    return counts


def measure(n_trials: int, storage: str | None, study: Path, table: Path, search: str = "walk") -> dict:
    """One run of the loop, in this process, on the ``explorer`` this process imports.

    ``search``: ``walk`` (the frontier walk and neighbours, the default before issue 23 and the
    reference commits' only search: the loop's own cost for the same search work) or
    ``default`` (this tree's default, the joint models since issue 23)."""
    import explorer
    from explorer.launch import launcher_for
    from explorer.search import _neighbours
    from explorer.study import open_study, optimize
    from explorer.study_file import load_study

    if hasattr(_neighbours, "SURROGATE"):  # a tree from before issue 23 has only the walk
        _neighbours.SURROGATE = search == "default"
    counts = count_statements()
    loaded = load_study(study, replay_table=table)
    with tempfile.TemporaryDirectory() as tmp:
        url = storage or f"sqlite:///{tmp}/overhead.db"
        spec = loaded.spec.model_copy(update={"n_trials": n_trials})
        run = dataclasses.replace(loaded, spec=spec, storage_url=url, output_dir=Path(tmp))
        launcher = TimedLauncher(launcher_for(run, output_dir=Path(tmp)))
        load_before = os.getloadavg()
        before = collections.Counter(counts)
        started = time.perf_counter()
        result = optimize(run, printer=lambda _: None, launcher=launcher)  # type: ignore[arg-type]
        wall = time.perf_counter() - started
        statements = dict(counts - before)
        stored = open_study(run, create=False)
        trials = stored.get_trials(deepcopy=False)
        noted = trials_with_a_note(stored, trials)
        raw = {
            "code": str(Path(explorer.__file__).resolve().parents[1]),
            "study": study.name,
            "search": search,
            "storage": "sqlite" if url.startswith("sqlite") else url.split(":", 1)[0],
            "n_trials": n_trials,
            "counted": result.counted,
            "statuses": result.statuses,
            "wall_seconds": wall,
            "launcher_seconds": launcher.seconds,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "statements": statements,
            "finished_trials_with_a_dashboard_note": noted,
            "trials": [
                [t.number, t.datetime_start.timestamp(), t.datetime_complete.timestamp()]
                for t in trials
                if t.datetime_start is not None and t.datetime_complete is not None
            ],
        }
    raw.update(summarize(raw))
    return raw


def trials_with_a_note(study, trials: list) -> list[int]:  # noqa: ANN001
    """How many of the finished ``trials`` carry a dashboard note, and how many are finished."""
    from optuna_dashboard._note import get_note_from_system_attrs

    attrs = study._storage.get_study_system_attrs(study._study_id)
    finished = [t for t in trials if t.state.is_finished()]
    noted = sum(bool(get_note_from_system_attrs(attrs, t._trial_id)["body"]) for t in finished)
    return [noted, len(finished)]


def summarize(raw: dict) -> dict:
    """The per-trial figures, from the raw ones."""
    own = raw["wall_seconds"] - raw["launcher_seconds"]
    n = len(raw["trials"])
    figures = {
        "optuna_trials": n,
        "ms_per_counted_trial": 1000 * own / raw["counted"],
        "ms_per_optuna_trial": 1000 * own / n,
    }
    if "statements" in raw:
        figures["write_commits_per_optuna_trial"] = raw["statements"].get("write_commits", 0) / n
        figures["selects_per_optuna_trial"] = raw["statements"].get("SELECT", 0) / n
    return figures


def line(raw: dict) -> str:
    figures = (
        f"{raw['optuna_trials']} Optuna trials ({raw['statuses']}), {raw['counted']} counted, in "
        f"{raw['wall_seconds']:.1f} s ({raw['launcher_seconds']:.2f} s in the launcher): "
        f"{raw['ms_per_counted_trial']:.1f} ms a counted trial, {raw['ms_per_optuna_trial']:.1f} ms an "
        f"Optuna trial"
    )
    if "write_commits_per_optuna_trial" in raw:
        figures += (
            f"; {raw['write_commits_per_optuna_trial']:.1f} write transactions and "
            f"{raw['selects_per_optuna_trial']:.1f} SELECTs a trial"
        )
    if "finished_trials_with_a_dashboard_note" in raw:
        figures += "; dashboard notes on {} of {} finished trials".format(
            *raw["finished_trials_with_a_dashboard_note"]
        )
    load = raw.get("load_average_before")
    return figures + (f" (load average {load[0]:.2f} before)" if load else "")


def _commit_of(tree: Path) -> str:
    """``tree``'s commit, ``+changes`` where it has uncommitted changes to tracked files."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    changes = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return (head.stdout.strip() or "unknown") + ("+changes" if changes.stdout.strip() else "")


def paired(args: argparse.Namespace, storage: Callable[[], str | None]) -> dict:
    """``--rounds`` rounds of (reference, this tree), each run in a process of its own."""
    runs = []
    for round_ in range(args.rounds):
        for name, tree in (("reference", args.against.resolve()), ("this tree", ROOT)):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run.json"
                env = {**os.environ, "PYTHONPATH": str(tree)}
                if url := storage():
                    env[STORAGE_ENV] = url
                cmd = [sys.executable, __file__, "--n-trials", str(args.n_trials), "--out", str(out)]
                cmd += ["--study", str(args.study), "--table", str(args.table), "--search", args.search]
                subprocess.run(cmd, env=env, check=True)
                raw = json.loads(out.read_text())
            raw.update(round=round_, tree=name, commit=_commit_of(tree))
            print(f"round {round_} {name} ({raw['commit'][:7]}): {line(raw)}", flush=True)
            runs.append(raw)
    mine = [r for r in runs if r["tree"] == "this tree"]
    best = min(mine, key=lambda r: r["ms_per_optuna_trial"])
    reference = min((r for r in runs if r["tree"] == "reference"), key=lambda r: r["ms_per_optuna_trial"])
    return {
        **best,
        "commit": best["commit"],
        "reference": {k: reference[k] for k in reference if k != "trials"},
        "paired": [{k: r[k] for k in r if k != "trials"} for r in runs],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-trials", type=int, default=500)
    parser.add_argument("--storage", help="default: a sqlite file in a temporary folder")
    parser.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL server on 127.0.0.1")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--against", type=Path, help="a checkout of the reference commit, run beside this tree"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="with --against: rounds of (reference, this tree)"
    )
    parser.add_argument("--study", type=Path, default=STUDY)
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument(
        "--search",
        choices=["walk", "default"],
        default="walk",
        help="walk: the search the reference commits run (the same work); default: this tree's",
    )
    args = parser.parse_args()
    args.study, args.table = args.study.resolve(), args.table.resolve()
    server = None
    if args.postgres:
        sys.path.insert(0, str(ROOT))
        from tests._postgres import PostgresServer, find_bindir

        bindir = find_bindir()
        if bindir is None:
            raise SystemExit("no PostgreSQL binaries: run scripts/postgres.sh install")
        server = PostgresServer(bindir)
        server.start()
    try:
        fixed = args.storage or os.environ.get(STORAGE_ENV)

        def storage() -> str | None:
            return server.url(server.create_database()) if server is not None else fixed

        if args.against is not None:
            raw = paired(args, storage)
        else:
            raw = measure(args.n_trials, storage(), args.study, args.table, args.search)
            print(line(raw))
    finally:
        if server is not None:
            server.stop()
    args.out.write_text(json.dumps(raw, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
