"""Replay tables for ``explorer benchmark-search``, and the benchmark over them (issue 4).

Two kinds of table:

* measured: ``studies/cpu-table.yaml`` run whole on this machine's CPU and exported
  (``benchmarks/results/tables/cpu-quickstart.csv``);
* modelled: a memory and throughput model of one 8 x H100-80GB node for a given model (below),
  written as ``benchmarks/results/tables/model-<name>.csv``.

The model (deliberately simple; every constant is here):

* memory per GPU = model states + activations + logits, OOM above 90% of 80 GiB:
  - model states, full fine-tuning with AdamW in fp32 master weights: 16 bytes a parameter,
    divided by N GPUs under FULL_SHARD, 4 + 12/N under SHARD_GRAD_OP, whole under NO_SHARD / DDP;
  - activations: 34 * s * b * h bytes a layer without checkpointing (Korthikanti et al., flash
    attention), 2 * s * b * h a layer plus one layer's 34 * s * b * h with checkpointing;
  - logits: 10 * s * b * V bytes (bf16 logits, their fp32 copy and its gradient);
* time per step = compute + 30% of communication (70% overlaps):
  - compute = 6 * P * tokens (8 * P * tokens with checkpointing) / (989 TFLOP/s * efficiency),
    efficiency = 0.55 * t / (t + 4096) for t tokens a GPU a step (small steps use the GPU badly);
  - communication per step at 300 GB/s per GPU: DDP and NO_SHARD all-reduce fp32 gradients
    (2 * 4P * (N-1)/N bytes); FULL_SHARD gathers bf16 parameters twice and reduce-scatters fp32
    gradients (2 * 2P + 4P) * (N-1)/N; SHARD_GRAD_OP gathers once: (2P + 4P) * (N-1)/N;
    FSDP2 is taken as 5% faster than FSDP1 at the same strategy;
* throughput = dataset tokens a GPU a step / time (every entry fills the sequence).

    .venv/bin/python benchmarks/search_tables.py tables           # write the modelled tables
    .venv/bin/python benchmarks/search_tables.py search --repeats 40 --n-trials 200
    .venv/bin/python benchmarks/search_tables.py search --repeats 40 --n-trials 200 --first-seed 40
    .venv/bin/python benchmarks/search_tables.py remeasure --rounds 4  # see remeasure()
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "benchmarks" / "results" / "tables"
GIB = 2**30
PEAK = 989e12
BANDWIDTH = 300e9
OVERLAP = 0.7


@dataclass(frozen=True)
class Model:
    name: str
    params: float
    hidden: int
    layers: int
    vocab: int


MODELS = {
    "granite-3.1-2b": Model("granite-3.1-2b", 2.5e9, 2048, 40, 49155),
    "llama-3.1-8b": Model("llama-3.1-8b", 8.0e9, 4096, 32, 128256),
}
GPU = "NVIDIA-H100-80GB-HBM3"


def memory_gib(m: Model, *, gpus: int, per_gpu_batch: int, seq: int, ckpt: bool, strategy: str) -> float:
    p = m.params
    states = {"FULL_SHARD": 16 * p / gpus, "SHARD_GRAD_OP": 4 * p + 12 * p / gpus}.get(strategy, 16 * p)
    act_layer = 34 * seq * per_gpu_batch * m.hidden
    acts = (2 * seq * per_gpu_batch * m.hidden * m.layers + act_layer) if ckpt else act_layer * m.layers
    logits = 10 * seq * per_gpu_batch * m.vocab
    return (states + acts + logits) / GIB


def tokens_per_second_per_gpu(
    m: Model, *, gpus: int, per_gpu_batch: int, seq: int, ckpt: bool, strategy: str, fsdp_version: int | None
) -> float:
    tokens = per_gpu_batch * seq
    eff = 0.55 * tokens / (tokens + 4096)
    compute = (8 if ckpt else 6) * m.params * tokens / (PEAK * eff)
    share = (gpus - 1) / gpus
    p = m.params
    volume = {
        "FULL_SHARD": (2 * 2 * p + 4 * p) * share,
        "SHARD_GRAD_OP": (2 * p + 4 * p) * share,
    }.get(strategy, 2 * 4 * p * share)
    comm = volume / BANDWIDTH if gpus > 1 else 0.0
    step = compute + (1 - OVERLAP) * comm
    if fsdp_version == 2:
        step /= 1.05
    return tokens / step


def model_rows(
    m: Model, *, seqs: tuple[int, ...] = (2048,), batches: tuple[int, ...] = (8, 16, 32, 64, 128)
) -> list[dict]:
    rows = []
    for seq in seqs:
        for gpus in (1, 2, 4, 8):
            for bs in batches:
                if bs % gpus:
                    continue
                for ckpt in (False, True):
                    if gpus == 1:
                        backends = [("NONE", None, None)]
                    else:
                        backends = [("DDP", None, None)]
                        backends += [("FSDP", 1, s) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")]
                        backends += [("FSDP", 2, s) for s in ("FULL_SHARD", "SHARD_GRAD_OP")]
                    for backend, version, strategy in backends:
                        b = bs // gpus
                        mem = memory_gib(
                            m, gpus=gpus, per_gpu_batch=b, seq=seq, ckpt=ckpt, strategy=strategy or "DDP"
                        )
                        fits = mem <= 0.9 * 80
                        tput = tokens_per_second_per_gpu(
                            m,
                            gpus=gpus,
                            per_gpu_batch=b,
                            seq=seq,
                            ckpt=ckpt,
                            strategy=strategy or "DDP",
                            fsdp_version=version,
                        )
                        rows.append(
                            {
                                "model_name": m.name,
                                "gpu_model": GPU,
                                "model_max_length": seq,
                                "number_gpus": gpus,
                                "batch_size": bs,
                                "gradient_checkpointing": ckpt,
                                "distributed_backend": backend,
                                "fsdp_version": version or "",
                                "fsdp_sharding_strategy": strategy or "",
                                "dataset_tokens_per_second_per_gpu": round(tput, 1) if fits else 0.0,
                                "peak_memory_gib": round(mem, 2),
                                "is_valid": int(fits),
                            }
                        )
    return rows


WIDE = {"seqs": (1024, 2048, 4096), "batches": (4, 8, 16, 32, 64, 128, 256)}
"""The wide granite table (762 configurations) for the 500-trial overhead study
(``benchmarks/optuna_overhead.py``): more sequence lengths and batch sizes, same model."""


def write_tables() -> list[Path]:
    TABLES.mkdir(parents=True, exist_ok=True)
    paths = []
    tables = [(f"model-{m.name}.csv", model_rows(m)) for m in MODELS.values()]
    tables.append(("model-granite-3.1-2b-wide.csv", model_rows(MODELS["granite-3.1-2b"], **WIDE)))  # type: ignore[arg-type]
    for name, rows in tables:
        path = TABLES / name
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        valid = [r for r in rows if r["is_valid"]]
        best = max(r["dataset_tokens_per_second_per_gpu"] for r in valid)
        near = sum(r["dataset_tokens_per_second_per_gpu"] >= 0.98 * best for r in valid)
        print(f"{path.name}: {len(rows)} configurations, {len(valid)} fit, best {best:.0f}, {near} within 2%")
        paths.append(path)
    return paths


def search(repeats: int, n_trials: int, first_seed: int = 0) -> dict:
    from explorer.search_benchmark import benchmark_search, format_table, to_json
    from explorer.study_file import load_study

    studies = {
        "cpu-quickstart.csv": ROOT / "studies" / "cpu-table.yaml",
        "model-granite-3.1-2b.csv": ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b.yaml",
        "model-llama-3.1-8b.csv": ROOT / "benchmarks" / "search_studies" / "llama-3.1-8b.yaml",
    }
    out = {}
    for table, study in studies.items():
        loaded = load_study(study, replay_table=TABLES / table)
        result = benchmark_search(loaded, repeats=repeats, n_trials=n_trials, first_seed=first_seed)
        print(format_table(result), flush=True)
        out[table] = json.loads(to_json(result))
    name = "search_benchmark.json" if first_seed == 0 else f"search_benchmark.seeds{first_seed}.json"
    path = ROOT / "benchmarks" / "results" / name
    path.write_text(json.dumps(out, indent=2))
    return out


def remeasure(rounds: int) -> Path:
    """Measure every feasible one-process configuration of the CPU table ``rounds`` more times.

    The CPU table measured each configuration once, with an 8-step screen; on this machine one run
    varies by 3-9% (issue 3), more than the 2% band of benchmark-search's target, so the best row
    was partly a draw. Every configuration of the rule (one process, measured feasible: the ones
    that can be near the best; two processes share the same two cores and reach at most 0.6 of it)
    is measured again, all alike, each round in a fresh study of its own (so nothing is reused),
    with the table's own study file; the rows are appended, and the replay launcher answers a
    configuration with several rows from their median.
    """
    import dataclasses
    import tempfile

    from explorer.export import export_rows
    from explorer.study import open_study, optimize
    from explorer.study_file import load_study
    from explorer.trial_config import TrialConfig

    table = TABLES / "cpu-quickstart.csv"
    with table.open(newline="") as fh:
        reader = csv.DictReader(fh)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    chosen = [r for r in rows if r["number_gpus"] == "1" and r["is_valid"] == "1"]
    configs = [
        TrialConfig(
            batch_size=int(r["batch_size"]),
            number_gpus=1,
            distributed_backend="NONE",
            gradient_checkpointing=r["gradient_checkpointing"] == "True",
            model_max_length=int(r["model_max_length"]),
        )
        for r in chosen
    ]
    print(f"re-measuring {len(configs)} one-process configurations x {rounds} rounds", flush=True)
    base = load_study(ROOT / "studies" / "cpu-table.yaml")
    added = []
    for k in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            spec = base.spec.model_copy(
                update={
                    "name": f"cpu-table-remeasure-{k}",
                    "n_trials": len(configs),
                    "reuse_measurements": False,
                }
            )
            loaded = dataclasses.replace(
                base, spec=spec, storage_url=f"sqlite:///{tmp}/r.db", output_dir=Path(tmp) / "runs"
            )
            study = open_study(loaded, create=True)
            for config in configs:
                study.enqueue_trial(loaded.space.params_for(config))
            optimize(loaded, printer=lambda line: print(line, flush=True) if "tok/s" in line else None)
            for row in export_rows(loaded):
                added.append({c: row.get(c, "") for c in columns})
    with table.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writerows(added)
    print(f"{table}: {len(added)} rows added", flush=True)
    return table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["tables", "search", "remeasure"])
    parser.add_argument(
        "--rounds", type=int, default=4, help="remeasure: measurements added per configuration"
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--n-trials", type=int, default=40)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="search: seeds from this one (written to a file of its own)"
    )
    args = parser.parse_args()
    if args.what == "tables":
        write_tables()
    elif args.what == "remeasure":
        remeasure(args.rounds)
    else:
        search(args.repeats, args.n_trials, args.first_seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
