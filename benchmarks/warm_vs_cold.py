"""Does the warm start change what a trial measures? Warm-forked and fresh-interpreter ranks, alternating.

Both run the quickstart's 1-process configuration for a fixed 150 steps, through the same Ray
launcher; only ``launcher.warm_start`` differs. Raw runs go to
benchmarks/results/warm_vs_cold.jsonl; the summary is recomputed from that file alone.

    .venv/bin/python benchmarks/warm_vs_cold.py              # about 3 minutes on 2 cores
    .venv/bin/python benchmarks/warm_vs_cold.py --summarize
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measurement_quality as mq  # noqa: E402

from explorer.launch import RayLauncher  # noqa: E402
from explorer.measure import measure, with_measurement  # noqa: E402
from explorer.study_file import load_study  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "warm_vs_cold.jsonl"


def run(pairs: int) -> None:
    loaded = with_measurement(
        load_study(ROOT / "studies" / "quickstart.yaml"), stop="steps", warmup_steps=3, measured_steps=150
    )
    launchers = {}
    for start in ("warm", "cold"):
        launcher_spec = loaded.spec.launcher.model_copy(update={"warm_start": start == "warm"})
        study = replace(loaded, spec=loaded.spec.model_copy(update={"launcher": launcher_spec}))
        launchers[start] = (study, RayLauncher.for_study(study.spec, output_dir=loaded.output_dir / start))
    launchers["warm"][1].start()  # one local Ray; the cold launcher uses it as it is
    launchers["cold"][1].start()
    try:
        for _ in range(pairs):
            for start in ("warm", "cold"):
                study, launcher = launchers[start]
                (m,) = measure(study, mq.CONFIGS["1proc"], launcher=launcher)
                mq.record(start, "1proc", m)
    finally:
        launchers["cold"][1].shutdown()
        launchers["warm"][1].shutdown()


def summarize() -> dict:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    out: dict = {}
    for start in ("warm", "cold"):
        ms = [r["measurement"] for r in rows if r["kind"] == start]
        tput = [m["properties"]["dataset_tokens_per_second_per_gpu"] for m in ms]
        out[start] = {
            "n": len(ms),
            "starts": sorted({m["extra"]["start"] for m in ms}),
            "throughput_mean": statistics.mean(tput),
            "throughput_cv": statistics.stdev(tput) / statistics.mean(tput) if len(tput) > 1 else 0.0,
            "throughputs": tput,
            "wall_median": statistics.median(m["wall_seconds"] for m in ms),
        }
    out["warm_over_cold"] = out["warm"]["throughput_mean"] / out["cold"]["throughput_mean"] - 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args()
    mq.RESULTS = RESULTS
    if not args.summarize:
        RESULTS.unlink(missing_ok=True)
        run(args.pairs)
    summary = summarize()
    RESULTS.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2))
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
