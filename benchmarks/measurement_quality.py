"""Issue 3's measurement figures on the quickstart model, through `explorer measure`'s code path.

For 1 process, 2 processes with DDP and 2 with FSDP it measures:
  * the steady-state rule, repeated (default 5): throughput, measured window, whole-trial wall time, CV;
  * one long fixed run of `--long-factor` (default 5) times the steady runs' median step count;
then the OOM trial's wall time against the median feasible trial, and the CPU memory cap on vs off.

Every run is appended as a JSON line (the raw Measurement, step times included) to
benchmarks/results/measurement_quality.jsonl; `--summarize` recomputes the table from that file alone.

    .venv/bin/python benchmarks/measurement_quality.py            # about 20 minutes on 2 cores
    .venv/bin/python benchmarks/measurement_quality.py --summarize
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from explorer.launch import RayLauncher
from explorer.measure import measure, with_measurement
from explorer.measurement import Measurement
from explorer.spec import LoadedStudy
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "measurement_quality.jsonl"

BASE = dict(gradient_checkpointing=False, model_max_length=128)
CONFIGS = {
    "1proc": TrialConfig(batch_size=16, number_gpus=1, distributed_backend="NONE", **BASE),
    "2proc-ddp": TrialConfig(batch_size=16, number_gpus=2, distributed_backend="DDP", **BASE),
    "2proc-fsdp": TrialConfig(
        batch_size=16,
        number_gpus=2,
        distributed_backend="FSDP",
        fsdp_version=1,
        fsdp_sharding_strategy="FULL_SHARD",
        **BASE,
    ),
}
STEADY = dict(
    stop="steady", warmup_steps=3, target_rel_ci=0.02, min_steps=10, max_steps=400, max_seconds=40.0
)


def record(kind: str, name: str, m: Measurement) -> None:
    """Append one run to ``RESULTS`` as a JSON line."""
    with RESULTS.open("a") as fh:
        fh.write(json.dumps({"kind": kind, "config": name, "measurement": json.loads(m.to_json())}) + "\n")


def run(repeats: int, long_factor: int, long_runs: int) -> None:
    loaded = load_study(ROOT / "studies" / "quickstart.yaml")
    launcher = RayLauncher.for_study(loaded.spec, output_dir=loaded.output_dir / "benchmark")
    launcher.start()  # one local Ray and one warm zygote for every run below
    try:
        _run(loaded, launcher, repeats, long_factor, long_runs)
    finally:
        launcher.shutdown()


def _run(loaded: LoadedStudy, launcher: RayLauncher, repeats: int, long_factor: int, long_runs: int) -> None:
    def go(study: LoadedStudy, config: TrialConfig, **kw: Any) -> Measurement:
        (m,) = measure(study, config, launcher=launcher, **kw)
        return m

    for name, config in CONFIGS.items():
        steady_vs_long(
            go, loaded, name, config, repeats=repeats, long_factor=long_factor, long_runs=long_runs
        )
    # OOM: the same 1-process configuration at a batch far beyond the 0.5 GiB cap
    oom = TrialConfig(batch_size=512, number_gpus=1, distributed_backend="NONE", **BASE)
    steady = with_measurement(loaded, **STEADY)
    for _ in range(3):
        record("oom", "1proc-bs512", go(steady, oom))
    # The CPU memory cap must not change the throughput of a configuration that fits
    fixed = with_measurement(loaded, stop="steps", warmup_steps=3, measured_steps=150)
    for _ in range(repeats):
        for cap in ("study", None):
            kind = "cap-on" if cap == "study" else "cap-off"
            record(kind, "1proc", go(fixed, CONFIGS["1proc"], memory_cap_gib=cap))


def steady_vs_long(
    go: Callable[[LoadedStudy, TrialConfig], Measurement],
    loaded: LoadedStudy,
    name: str,
    config: TrialConfig,
    *,
    repeats: int,
    long_factor: int,
    long_runs: int,
    steady_rule: dict[str, Any] | None = None,
) -> None:
    """``repeats`` steady-rule runs of ``config``, with ``long_runs`` long fixed runs between them.

    Steady and long runs alternate, so that a slow drift of a shared machine's speed affects both
    alike. Each long run is ``long_factor`` x the most steps a steady run took so far, and its
    warmup is the most the steady rule may exclude (``warmup_steps + min_steps``), so that a
    one-off spike the steady rule moved into its warmup does not weigh on the reference either.
    """
    rule = steady_rule or STEADY
    steady = with_measurement(loaded, **rule)
    warmup = int(rule["warmup_steps"]) + int(rule["min_steps"])
    steps: list[int] = []
    # spread out, the first after two steady runs (its length is 5x the most steps seen so far):
    # 5 repeats, 3 long runs: S S L S L S S L; 2 long runs: S S L S S L S
    long_after = {max(1, int((k + 1) * repeats / long_runs) - 1) for k in range(long_runs)}
    for i in range(repeats):
        m = go(steady, config)
        record("steady", name, m)
        if m.properties:
            steps.append(m.properties.measured_steps)
        if i in long_after and steps:
            n = long_factor * max(steps)
            long = with_measurement(loaded, stop="steps", warmup_steps=warmup, measured_steps=n)
            record("long", name, go(long, config))


def _cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def summarize(names: list[str] | None = None) -> dict:
    """The figures of the JSON lines in ``RESULTS`` (configurations ``names``: default CONFIGS)."""
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    out: dict = {}
    feasible_walls = []
    for name in names or list(CONFIGS):
        steady = [r["measurement"] for r in rows if r["kind"] == "steady" and r["config"] == name]
        long = [r["measurement"] for r in rows if r["kind"] == "long" and r["config"] == name]
        if not steady or not long:
            continue
        tput = [m["properties"]["dataset_tokens_per_second_per_gpu"] for m in steady]
        walls = [m["wall_seconds"] for m in steady]
        windows = [m["properties"]["warmup_seconds"] + m["properties"]["measured_seconds"] for m in steady]
        feasible_walls += walls
        long_tputs = [m["properties"]["dataset_tokens_per_second_per_gpu"] for m in long]
        long_tput = statistics.mean(long_tputs)
        long_training = statistics.mean(
            m["properties"]["warmup_seconds"] + m["properties"]["measured_seconds"] for m in long
        )
        long_wall = statistics.mean(m["wall_seconds"] for m in long)
        long_steps = [m["properties"]["measured_steps"] for m in long]
        steady_steps = statistics.median(m["properties"]["measured_steps"] for m in steady)
        # each long run against the steady runs just before and after it (robust to a slow drift of
        # the machine's speed over the benchmark)
        sequence = [r for r in rows if r["config"] == name and r["kind"] in ("steady", "long")]
        adjacent = []
        for i, r in enumerate(sequence):
            if r["kind"] != "long":
                continue
            near = [
                sequence[j]["measurement"]["properties"]["dataset_tokens_per_second_per_gpu"]
                for j in (i - 1, i + 1)
                if 0 <= j < len(sequence) and sequence[j]["kind"] == "steady"
            ]
            long_i = r["measurement"]["properties"]["dataset_tokens_per_second_per_gpu"]
            adjacent.append(statistics.mean(near) / long_i - 1)
        out[name] = {
            "steady_throughput_median": statistics.median(tput),
            "steady_cv_over_repeats": _cv(tput),
            "steady_steps_median": steady_steps,
            "steady_stop_reasons": sorted({m["properties"]["stop_reason"] for m in steady}),
            "steady_training_seconds_median": statistics.median(windows),
            "steady_trial_wall_median": statistics.median(walls),
            "long_throughput": long_tput,
            "long_throughputs": long_tputs,
            "long_cv": _cv(long_tputs),
            "long_steps": long_steps,
            "long_steps_over_steady_median": min(long_steps) / steady_steps,
            "long_training_seconds": long_training,
            "long_trial_wall": long_wall,
            "max_abs_error_vs_long": max(abs(t / long_tput - 1) for t in tput),
            "median_error_vs_long": statistics.median(t / long_tput - 1 for t in tput),
            "median_steady_error_vs_long": statistics.median(tput) / long_tput - 1,
            "adjacent_steady_errors_vs_long": adjacent,
            "training_time_ratio": statistics.median(windows) / long_training,
            "trial_wall_ratio": statistics.median(walls) / long_wall,
        }
    oom = [r["measurement"] for r in rows if r["kind"] == "oom"]
    if oom and feasible_walls:
        out["oom"] = {
            "outcomes": sorted({m["outcome"] for m in oom}),
            "oom_wall_median": statistics.median(m["wall_seconds"] for m in oom),
            "feasible_wall_median": statistics.median(feasible_walls),
            "fraction": statistics.median(m["wall_seconds"] for m in oom) / statistics.median(feasible_walls),
        }
    for kind in ("cap-on", "cap-off"):
        t = [
            r["measurement"]["properties"]["dataset_tokens_per_second_per_gpu"]
            for r in rows
            if r["kind"] == kind
        ]
        if t:
            out[kind] = {"n": len(t), "mean": statistics.mean(t), "cv": _cv(t), "values": t}
    if "cap-on" in out and "cap-off" in out:
        out["cap_effect"] = out["cap-on"]["mean"] / out["cap-off"]["mean"] - 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--long-factor", type=int, default=5)
    parser.add_argument("--long-runs", type=int, default=3, help="long runs per configuration")
    parser.add_argument(
        "--summarize", action="store_true", help="only recompute the summary from the JSON lines"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON-lines file to write or read")
    args = parser.parse_args()
    globals()["RESULTS"] = args.results
    if not args.summarize:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.unlink(missing_ok=True)
        run(args.repeats, args.long_factor, args.long_runs)
    summary = summarize()
    (RESULTS.with_suffix(".summary.json")).write_text(json.dumps(summary, indent=2))
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
