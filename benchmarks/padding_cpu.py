"""Dataset tokens per second with each ``padding`` mode, on short entries (CPU, one process).

The study ``benchmarks/padding_cpu.yaml``: a 2-layer llama, synthetic entries of 16-128 tokens,
model_max_length 512, batch 8. Each mode runs ``--repeats`` times, interleaved (max_length,
longest, packed, max_length, ...), through the real worker. The JSON keeps each run's measured
dataset tokens, trained tokens and seconds; ``tests/test_benchmark_results.py`` recomputes the
throughputs and the packed / max_length ratio from them. Keep the machine otherwise idle.

    .venv/bin/python benchmarks/padding_cpu.py [--repeats 3] [--out JSON]

``--study`` runs another study's workload, with ``--set NAME=VALUE`` fixing what its space
searches (as ``explorer measure --set``), each of the study's padding modes in turn. The README's
JSONL figure (``padding_jsonl.json``)::

    .venv/bin/python benchmarks/padding_cpu.py --study studies/local-jsonl.yaml \
        --set batch_size=8 --set number_gpus=1 --repeats 6 --out benchmarks/results/padding_jsonl.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.job import TrialJob  # noqa: E402
from explorer.launch import run_trial  # noqa: E402
from explorer.measure import config_from_cli  # noqa: E402
from explorer.study_file import load_study  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "padding_cpu.json"
STUDY = ROOT / "benchmarks" / "padding_cpu.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--study", type=Path, default=STUDY)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    loaded = load_study(args.study)
    modes = [str(v) for v in loaded.space.domains["padding"].values]
    configs = {m: config_from_cli(loaded, sets=[*args.set, f"padding={m}"], config_file=None) for m in modes}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in modes:
                job = TrialJob.for_study(loaded, configs[mode], trial_number=len(runs))
                m = run_trial(job, work_dir=Path(tmp) / f"run-{len(runs)}", timeout_s=300)
                p = m.properties
                assert p is not None, m.error
                runs.append(
                    {
                        "padding": mode,
                        "repeat": repeat,
                        "measured_dataset_tokens": p.measured_dataset_tokens,
                        "measured_train_tokens": p.measured_train_tokens,
                        "measured_seconds": p.measured_seconds,
                        "dataset_tokens_per_second_per_gpu": p.dataset_tokens_per_second_per_gpu,
                    }
                )
                print(f"{mode:10s} {p.dataset_tokens_per_second_per_gpu:10.1f} dataset tok/s/gpu", flush=True)
    medians = {
        mode: statistics.median(
            r["measured_dataset_tokens"] / r["measured_seconds"] for r in runs if r["padding"] == mode
        )
        for mode in modes
    }
    study = args.study.resolve().relative_to(ROOT).as_posix()
    result = {"study": study, "set": args.set, "runs": runs, "median_dataset_tokens_per_second": medians}
    result["packed_over_max_length"] = medians["packed"] / medians["max_length"]
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"packed / max_length: {result['packed_over_max_length']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
