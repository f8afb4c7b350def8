"""A chaos run (issue 6, must-show 1-3): a study with injected faults, a SIGKILL and a SIGINT of the
real ``explorer optimize`` process, a resume after each, then the accounting audit.

The study (default ``benchmarks/search_studies/faults-granite-3.1-2b.yaml``: 100 trials replayed
from the modelled granite table on an 8-GPU pool, paced in real time, 20% of first attempts and
25% of retries given a fault of every kind) is copied into a temporary folder with its paths made
absolute, so its output folder (the write-ahead files the audit checks) starts empty. Then:

1. ``explorer optimize`` until ``--kill-at`` trials count, then SIGKILL;
2. ``explorer optimize`` (the resume) until ``--interrupt-at`` trials count, then SIGINT (it
   must exit 130 after marking its running trials interrupted);
3. ``explorer optimize`` to the end (exit 0);
4. :func:`explorer.study.audit` on the storage and the output folder.

The JSON holds the audit, the phases (exit codes, counted trials when signalled, seconds) and one
row per Optuna trial, from which ``tests/test_benchmark_results.py`` recomputes the counts.

    .venv/bin/python benchmarks/fault_injection.py [--study S] [--storage URL | --postgres] [--json PATH]
    .venv/bin/python benchmarks/fault_injection.py --study studies/quickstart-faults.yaml \\
        --kill-at 0 --interrupt-at 0 --json benchmarks/results/fault_injection_quickstart.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.secrets import mask_url  # noqa: E402
from explorer.study import audit, counted_trials, open_study  # noqa: E402
from explorer.study_file import load_study  # noqa: E402

STUDY = ROOT / "benchmarks" / "search_studies" / "faults-granite-3.1-2b.yaml"
OUT = ROOT / "benchmarks" / "results" / "fault_injection.json"


def copy_study(src: Path, folder: Path, *, seed: int | None = None) -> Path:
    """``src`` written into ``folder`` with its search space and replay table as absolute paths,
    and its output folder inside ``folder`` (``seed``: the sampler's and the faults' seed)."""
    data = yaml.safe_load(src.read_text())
    if seed is not None:
        data.setdefault("sampler", {})["seed"] = seed
        if data.get("faults"):
            data["faults"]["seed"] = seed
    base = src.resolve().parent
    if isinstance(data.get("search_space"), str):
        data["search_space"] = str((base / data["search_space"]).resolve())
    launcher = data.get("launcher") or {}
    if launcher.get("table"):
        launcher["table"] = str((base / launcher["table"]).resolve())
    data["output_dir"] = str(folder / "runs")
    path = folder / src.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _counted(study_file: Path, storage: str) -> int:
    try:
        return len(counted_trials(open_study(load_study(study_file, storage=storage), create=False)))
    except KeyError:  # not created yet
        return 0


def _start(study_file: Path, storage: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "explorer", "optimize", str(study_file), "--storage", storage],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
    )


def _phase(
    study_file: Path, storage: str, *, until: int | None, sig: signal.Signals | None
) -> dict[str, Any]:
    """One ``explorer optimize``: signalled with ``sig`` once ``until`` trials count, or run to its end."""
    started = time.monotonic()
    proc = _start(study_file, storage)
    at = None
    if until is not None and sig is not None:
        while (at := _counted(study_file, storage)) < until:
            if proc.poll() is not None:
                raise SystemExit(
                    f"optimize ended before {until} trials counted:\n{proc.communicate()[0][-3000:]}"
                )
            time.sleep(0.1)
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=3600)
    return {
        "signal": sig.name if sig is not None else None,
        "counted_when_signalled": at,
        "exit": proc.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "traceback": "Traceback" in out,
        "traceback_text": out[out.index("Traceback") - 200 :][:4000] if "Traceback" in out else None,
        "resume_lines": [line for line in out.splitlines() if line.startswith(("resume:", "interrupted:"))],
        "tail": out.splitlines()[-3:],
    }


def trial_rows(study: Any) -> list[dict[str, Any]]:
    keys = (
        "status",
        "attempt",
        "injected_fault",
        "requeued_from",
        "reused_from",
        "inferred_from",
        "recovered",
    )
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {"number": t.number, "state": t.state.name, **{k: t.user_attrs.get(k) for k in keys}}
        row["error"] = str(t.user_attrs.get("error") or "")[:120]
        row["value"] = t.values[0] if t.values else None
        rows.append(row)
    return rows


def run(
    study: Path, *, storage: str | None, kill_at: int, interrupt_at: int, seed: int | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="explorer-chaos-") as tmp:
        study_file = copy_study(study, Path(tmp), seed=seed)
        url = storage or f"sqlite:///{tmp}/chaos.db"
        started = time.monotonic()
        phases = []
        if kill_at:
            phases.append(_phase(study_file, url, until=kill_at, sig=signal.SIGKILL))
        if interrupt_at:
            phases.append(_phase(study_file, url, until=interrupt_at, sig=signal.SIGINT))
        phases.append(_phase(study_file, url, until=None, sig=None))
        wall = time.monotonic() - started
        loaded = load_study(study_file, storage=url)
        stored = open_study(loaded, create=False)
        spec = loaded.spec
        found = audit(
            stored,
            n_trials=spec.n_trials,
            max_retries=spec.launcher.max_retries,
            output_dir=loaded.output_dir,
        )
        return {
            "study": str(study.relative_to(ROOT)) if study.is_relative_to(ROOT) else str(study),
            "storage": mask_url(url).split(":", 1)[0] if storage else "sqlite",
            "wall_seconds": round(wall, 1),
            "phases": phases,
            "audit": found.to_dict(),
            "lost_measurements": sum(p.startswith("lost:") for p in found.problems),
            "stuck_running": sum("stuck RUNNING" in p for p in found.problems),
            "trials": trial_rows(stored),
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--study", type=Path, default=STUDY)
    parser.add_argument("--storage", help="SQLAlchemy URL (default: a sqlite file in a temporary folder)")
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="start a PostgreSQL server on 127.0.0.1 for the run (as the tests do: tests/_postgres.py)",
    )
    parser.add_argument(
        "--kill-at", type=int, default=30, help="SIGKILL once this many trials count (0: no kill)"
    )
    parser.add_argument("--interrupt-at", type=int, default=60, help="SIGINT once this many count (0: none)")
    parser.add_argument("--seed", type=int, help="override the study's sampler and fault seeds")
    parser.add_argument("--json", type=Path, default=OUT)
    args = parser.parse_args()
    server = None
    storage = args.storage
    if args.postgres:
        from tests._postgres import PostgresServer, find_bindir

        bindir = find_bindir()
        if bindir is None:
            raise SystemExit("no PostgreSQL binaries: run scripts/postgres.sh install")
        server = PostgresServer(bindir)
        server.start()
        storage = server.url(server.create_database())
    try:
        result = run(
            args.study.resolve(),
            storage=storage,
            kill_at=args.kill_at,
            interrupt_at=args.interrupt_at,
            seed=args.seed,
        )
    finally:
        if server is not None:
            server.stop()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    a = result["audit"]
    print(
        f"{result['study']} on {result['storage']}: {result['wall_seconds']} s in {len(result['phases'])} runs"
    )
    for p in result["phases"]:
        print(
            f"  {p['signal'] or 'to the end'}: at {p['counted_when_signalled']} counted, exit {p['exit']}, "
            f"{p['seconds']} s, traceback: {p['traceback']}"
        )
    print(f"  counted {a['counted']}/{a['n_trials']}: {a['states']}; other records: {a['bookkeeping']}")
    print(f"  faults: {a['faults']}")
    print(f"  lost measurements: {result['lost_measurements']}, stuck RUNNING: {result['stuck_running']}")
    print(f"  measurements written ahead: {a['measurements_on_disk']}; audit ok: {a['ok']}")
    for problem in a["problems"]:
        print(f"  problem: {problem}")
    return 0 if a["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
