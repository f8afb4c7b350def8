"""Dataset tokens per second of each ``padding`` mode under both trainers, on short JSONL entries
(CPU, one process): the same configuration measured by the ``transformers`` trainer
(``studies/local-jsonl.yaml``) and by TRL's ``SFTTrainer`` (``studies/local-jsonl-trl.yaml``).

Each (trainer, padding) runs ``--repeats`` times, interleaved, through the real worker, with the
stop rule ``steps`` (``--warmup`` then ``--steps`` measured steps). The JSON keeps each run's raw
per-step counts (``step_dataset_tokens``, ``step_times``) beside its measured rate;
``tests/test_trl_trainer.py`` recomputes every rate, the medians and the ratios from them. Keep the
machine otherwise idle.

    .venv/bin/python benchmarks/trl_padding.py [--repeats 3] [--steps 4] [--modes max_length packed]
        [--set batch_size=8] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.job import TrialJob  # noqa: E402
from explorer.launch import run_trial  # noqa: E402
from explorer.measure import config_from_cli, with_measurement  # noqa: E402
from explorer.study_file import load_study  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "trl_padding.json"
STUDIES = {
    "transformers": ROOT / "studies" / "local-jsonl.yaml",
    "trl": ROOT / "studies" / "local-jsonl-trl.yaml",
}
MODES = ("max_length", "longest", "packed")
SETS = ["batch_size=8", "number_gpus=1", "model_max_length=512"]


def _run(loaded, config, work: Path, number: int) -> dict:
    job = TrialJob.for_study(loaded, config, trial_number=number)
    job = replace(job, resources=job.resources.model_copy(update={"device_memory_gib": None}))
    m = run_trial(job, work_dir=work, timeout_s=300)
    p = m.properties
    assert p is not None, m.error
    return {
        "measured_dataset_tokens": p.measured_dataset_tokens,
        "measured_train_tokens": p.measured_train_tokens,
        "measured_samples": p.measured_samples,
        "measured_seconds": p.measured_seconds,
        "dataset_tokens_per_second": p.dataset_tokens_per_second,
        "step_dataset_tokens": m.extra["step_dataset_tokens"],
        "step_times": m.extra["step_times"],
        "trainer_record": m.extra["trainer"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--modes", nargs="+", default=list(MODES), choices=MODES, help="the paddings measured"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sets = [*SETS, *args.set]
    studies = {
        t: with_measurement(load_study(p), warmup_steps=args.warmup, measured_steps=args.steps, stop="steps")
        for t, p in STUDIES.items()
    }
    configs = {
        (t, m): config_from_cli(loaded, sets=[*sets, f"padding={m}"], config_file=None)
        for t, loaded in studies.items()
        for m in args.modes
    }
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for trainer, mode in configs:
                run = _run(
                    studies[trainer], configs[trainer, mode], Path(tmp) / f"run-{len(runs)}", len(runs)
                )
                runs.append({"trainer": trainer, "padding": mode, "repeat": repeat, **run})
                print(
                    f"{trainer:12s} {mode:10s} {run['dataset_tokens_per_second']:10.1f} dataset tok/s",
                    flush=True,
                )
    medians = {
        f"{t}/{m}": statistics.median(
            sum(r["step_dataset_tokens"]) / sum(r["step_times"])
            for r in runs
            if (r["trainer"], r["padding"]) == (t, m)
        )
        for t, m in configs
    }
    result = {
        "studies": {t: p.relative_to(ROOT).as_posix() for t, p in STUDIES.items()},
        "set": sets,
        "warmup_steps": args.warmup,
        "measured_steps": args.steps,
        "runs": runs,
        "median_dataset_tokens_per_second": medians,
        "packed_over_max_length": {t: medians[f"{t}/packed"] / medians[f"{t}/max_length"] for t in STUDIES},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for key, value in medians.items():
        print(f"{key:24s} {value:10.1f} dataset tok/s (median)")
    for trainer, ratio in result["packed_over_max_length"].items():
        print(f"{trainer}: packed / max_length {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
