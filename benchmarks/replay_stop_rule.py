"""Replay the steady stop rule offline on the step times of recorded long runs.

Each long run's step clock is fed to :func:`explorer.worker._stopping.decide` one step at a time,
as the Trainer would; the window the rule stops on is compared with the whole run. This isolates
drift *within* one process from the differences *between* processes that the benchmark's steady
and long runs also contain. Step times only: tokens a step are taken as constant.

    .venv/bin/python benchmarks/replay_stop_rule.py                     # the default rule
    .venv/bin/python benchmarks/replay_stop_rule.py --target-rel-ci 0.01 --min-steps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from explorer.spec import MeasurementSpec
from explorer.worker._stopping import decide

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [
    ROOT / "benchmarks" / "results" / "measurement_quality.unbalanced.jsonl",
    ROOT / "benchmarks" / "results" / "measurement_quality.slow-reap.jsonl",
    ROOT / "benchmarks" / "results" / "measurement_quality.jsonl",
    ROOT / "benchmarks" / "results" / "measurement_quality.cold-start.jsonl",
]
RULE = dict(stop="steady", warmup_steps=0, min_steps=10, target_rel_ci=0.02, max_steps=400, max_seconds=40.0)


def replay(step_times: list[float], spec: MeasurementSpec) -> dict:
    """Where the rule stops on ``step_times``, and how its window's mean compares with the whole."""
    ends: list[float] = []
    clock = 0.0
    decision = None
    for d in step_times:
        clock += d
        ends.append(clock)
        decision = decide(spec, start=0.0, ends=ends)
        if decision.stop:
            break
    assert decision is not None
    window = step_times[decision.warmup : len(ends)]
    whole = statistics.mean(step_times)
    return {
        "stopped_after": len(ends),
        "warmup": decision.warmup,
        "reason": decision.reason,
        # positive: the window's throughput reads higher than the whole run's
        "error": whole / statistics.mean(window) - 1,
    }


def summarize(paths: list[Path], **overrides: float) -> list[dict]:
    spec = MeasurementSpec.model_validate(RULE | overrides)
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            run = json.loads(line)
            if run["kind"] != "long":
                continue
            result = replay(run["measurement"]["extra"]["step_times"], spec)
            out.append({"file": path.name, "config": run["config"], **result})
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="*", type=Path, help="JSON-lines results (default: the CPU runs)")
    parser.add_argument("--target-rel-ci", type=float, default=RULE["target_rel_ci"])
    parser.add_argument("--min-steps", type=int, default=RULE["min_steps"])
    args = parser.parse_args()
    overrides = {"target_rel_ci": args.target_rel_ci, "min_steps": args.min_steps}
    rows = summarize(args.files or DEFAULT, **overrides)
    if not args.files and all(RULE[k] == v for k, v in overrides.items()):
        (ROOT / "benchmarks" / "results" / "replay_stop_rule.summary.json").write_text(
            json.dumps(rows, indent=2)
        )
    for r in rows:
        print(
            f"{r['file']:45} {r['config']:11} stop after {r['stopped_after']:4} ({r['reason']}) {r['error']:+.3f}"
        )
    errors = [abs(r["error"]) for r in rows]
    steps = statistics.median(r["stopped_after"] for r in rows)
    within = sum(e <= 0.03 for e in errors)
    print(
        f"within 3% of the whole run: {within} of {len(rows)}; worst {max(errors):.3f}; median steps {steps}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
