"""Issue 3's measurement figures on one real GPU, through the trial code path without Ray.

Run on a CUDA machine (one GPU is enough) with explorer importable::

    python benchmarks/gpu_check.py                      # about 3 minutes on one H100
    python benchmarks/gpu_check.py --summarize --results benchmarks/results/gpu_check.h100.jsonl

It measures ``studies/smollm2-360m-1xh100.yaml`` (SmolLM2-360M shape, bf16, 1024 tokens):

* the steady-state rule, repeated, against long fixed runs of 5x its step count, alternating;
* the OOM trial (batch 512, far beyond the study's 40 GiB cap) against the median feasible trial,
  with ranks forked from a warm zygote (as Ray trials start) and, for comparison, cold.

Every run is one JSON line (the raw Measurement, step times included) in the same format as
``measurement_quality.py``, whose ``summarize`` recomputes the figures from the file alone.
Ray is left out on purpose: one GPU gives one trial at a time, and ``run_trial`` is exactly what
a Ray trial actor calls.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measurement_quality as mq  # noqa: E402

from explorer.job import TrialJob  # noqa: E402
from explorer.launch import ensure_zygote, run_trial, zygote_environment  # noqa: E402
from explorer.measure import with_measurement  # noqa: E402
from explorer.measurement import Measurement  # noqa: E402
from explorer.spec import LoadedStudy  # noqa: E402
from explorer.study_file import load_study  # noqa: E402
from explorer.trial_config import TrialConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "smollm2-360m-1xh100.yaml"
BASE: dict[str, Any] = dict(number_gpus=1, distributed_backend="NONE", model_max_length=1024)
CONFIGS = {
    "1gpu-bs8": TrialConfig(batch_size=8, gradient_checkpointing=False, **BASE),
    "1gpu-bs32-ckpt": TrialConfig(batch_size=32, gradient_checkpointing=True, **BASE),
}
OOM = TrialConfig(batch_size=512, gradient_checkpointing=False, **BASE)
STEADY = dict(
    stop="steady", warmup_steps=3, target_rel_ci=0.02, min_steps=10, max_steps=400, max_seconds=30.0
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long-runs", type=int, default=2)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--no-oom", action="store_true", help="skip the OOM runs")
    parser.add_argument("--summarize", action="store_true")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check.jsonl")
    args = parser.parse_args()
    mq.RESULTS = args.results
    if not args.summarize:
        import torch

        assert torch.cuda.is_available(), "gpu_check.py needs a CUDA device"
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.unlink(missing_ok=True)
        run(load_study(STUDY), args.configs, args.repeats, args.long_runs, oom=not args.no_oom)
    summary = mq.summarize(args.configs)
    args.results.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2))
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


def run(loaded: LoadedStudy, names: list[str], repeats: int, long_runs: int, *, oom: bool) -> None:
    sock = ensure_zygote(owner_pid=os.getpid(), env=zygote_environment(cpu_count=os.cpu_count() or 1))
    numbers = itertools.count()
    work = Path(tempfile.mkdtemp(prefix="explorer-gpu-check-"))

    def go(study: LoadedStudy, config: TrialConfig, *, warm: bool = True) -> Measurement:
        n = next(numbers)
        job = TrialJob.for_study(study, config, trial_number=n)
        m = run_trial(job, work_dir=work / f"trial-{n:05d}", timeout_s=600, warm_start=warm, zygote=sock)
        props = m.properties
        tput = f"{props.dataset_tokens_per_second_per_gpu:.0f} tok/s/gpu" if props else m.error
        phases = m.extra.get("phases")
        print(
            f"run {n}: {config.batch_size=} {m.outcome.value} {tput} ({m.wall_seconds:.1f} s) {phases}",
            flush=True,
        )
        if m.outcome.value == "failed":
            print(m.log_tail[-3000:], flush=True)
        return m

    for name in names:
        config = CONFIGS[name]
        mq.steady_vs_long(
            go, loaded, name, config, repeats=repeats, long_factor=5, long_runs=long_runs, steady_rule=STEADY
        )
    if not oom:
        return
    steady = with_measurement(loaded, **STEADY)
    for _ in range(3):
        mq.record("oom", "1gpu-bs512", go(steady, OOM))
    mq.record("oom-cold", "1gpu-bs512", go(steady, OOM, warm=False))


if __name__ == "__main__":
    sys.exit(main())
