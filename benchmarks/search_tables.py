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
from typing import Any

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


# -- the knobs table (issue 15) -------------------------------------------------------------------

KNOBS_STUDY = ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b-knobs.yaml"
KNOBS_TABLE = "model-granite-3.1-2b-knobs.csv"
HEADS = 32
"""granite-3.1-2b's attention heads (its config.json)."""
ATTN_EFFICIENCY = {"flash_attention_2": 0.35, "sdpa": 0.25, "eager": 0.10}
"""Share of peak the attention kernels reach: FlashAttention-2 about 35% on an H100 (Shah et al.,
FlashAttention-3, 2024); sdpa with a mask (the memory-efficient kernel) and eager (unfused
matmuls, a float32 softmax: memory-bound) are assumptions."""
LIGER_SPEEDUP = 1.20
"""Liger Kernel's published anchor: +20% throughput, -60% memory (its README, Llama 3 8B)."""
PURE_BF16_SPEEDUP = 1.05
"""pure_bf16 skips the float32 master copy and its casts: an assumption, "somewhat faster"."""
OPTIM_TIME = {"adamw_torch": 1.0, "adamw_torch_fused": 1 / 1.02, "adamw_bnb_8bit": 1.0, "adafactor": 1.03}
"""Step time by optimizer: fused AdamW +2% (issue 15's anchor), adafactor a bit slower."""
PCIE = 25e9
"""Host-device bandwidth a GPU, bytes/s (PCIe 5 x16 in practice)."""
CPU_ADAM = 0.7e9
"""Parameters a second PyTorch's CPU AdamW steps a rank (order of magnitude of ZeRO-Offload's
PyTorch CPU Adam, Ren et al. 2021): an assumption."""


@dataclass(frozen=True)
class Lengths:
    """The entries' lengths (tokens) of the study's dataset, as the worker generates them."""

    values: tuple[int, ...]

    @classmethod
    def of_study(cls) -> Lengths:
        from explorer.study_file import load_study
        from explorer.worker._data import entry_length

        spec = load_study(KNOBS_STUDY, check_model=False).spec.workload.dataset
        return cls(tuple(sorted(entry_length(spec, i) for i in range(spec.entries))))

    def mean(self, seq: int) -> float:
        return sum(min(n, seq) for n in self.values) / len(self.values)

    def mean_square(self, seq: int) -> float:
        return sum(min(n, seq) ** 2 for n in self.values) / len(self.values)

    def longest_of(self, b: int, seq: int) -> float:
        """Expected longest of ``b`` entries drawn at random (with replacement)."""
        n = len(self.values)
        return sum(min(x, seq) * (((k + 1) / n) ** b - (k / n) ** b) for k, x in enumerate(self.values))


@dataclass(frozen=True)
class Work:
    """What one device does in a step: train tokens, attention score elements of one head (dense
    kernels) and squared entry lengths (flash), dataset tokens."""

    tokens: float
    dense: float
    flash: float
    dataset: float


def work(lengths: Lengths, *, padding: str, b: int, seq: int) -> Work:
    """One device's step on ``b`` entries: max_length pads each to ``seq``, longest to the batch's
    longest, packed concatenates them into one row (dense kernels then see its whole square
    under a block-diagonal mask; flash attends within each entry)."""
    mean = lengths.mean(seq)
    flash = b * lengths.mean_square(seq)
    if padding == "packed":
        return Work(tokens=b * mean, dense=(b * mean) ** 2, flash=flash, dataset=b * mean)
    row = seq if padding == "max_length" else lengths.longest_of(b, seq)
    return Work(tokens=b * row, dense=b * row**2, flash=flash, dataset=b * mean)


def state_bytes(c: Any) -> tuple[float, float, float]:
    """Bytes a parameter of weights, gradients and optimizer states."""
    pure = c.precision == "pure_bf16"
    optim = {"adamw_bnb_8bit": 2.0, "adafactor": 4.0}.get(c.optim, 8.0)
    if pure and c.optim != "adamw_bnb_8bit":
        optim /= 2
    return (2.0, 2.0, optim) if pure else (4.0, 4.0, optim)


def knobs_memory_gib(m: Model, c: Any, w: Work) -> float:
    p, n = m.params, c.number_gpus
    wb, gb, ob = state_bytes(c)
    strategy = c.fsdp_sharding_strategy if c.distributed_backend == "FSDP" else "DDP"
    if c.fsdp_cpu_offload:
        states = 2 * p if strategy == "SHARD_GRAD_OP" else 0.0
    else:
        states = {"FULL_SHARD": (wb + gb + ob) * p / n, "SHARD_GRAD_OP": wb * p + (gb + ob) * p / n}.get(
            strategy, (wb + gb + ob) * p
        )
    f = c.checkpoint_fraction if c.gradient_checkpointing else 0.0
    layer = 34 * w.tokens * m.hidden
    kept = (1 - f) * m.layers + (1 if f > 0 else 0)
    acts = (1 - f) * m.layers * layer + f * m.layers * 2 * w.tokens * m.hidden + (layer if f > 0 else 0)
    attn = {"eager": 6 * HEADS * w.dense * kept + 2 * w.dense, "sdpa": w.dense}.get(
        c.attn_implementation, 0.0
    )
    logits = 0.0 if c.liger_kernel else 10 * w.tokens * m.vocab
    return (states + acts + attn + logits) / GIB


def knobs_step_seconds(m: Model, c: Any, w: Work) -> float:
    p, n = m.params, c.number_gpus
    f = c.checkpoint_fraction if c.gradient_checkpointing else 0.0
    eff = 0.55 * w.tokens / (w.tokens + 4096)
    linear = (6 + 2 * f) * p * w.tokens / (PEAK * eff)
    flops = 6 * w.flash if c.attn_implementation == "flash_attention_2" else 12 * w.dense
    attn = (1 + f / 3) * flops * m.hidden * m.layers / (PEAK * ATTN_EFFICIENCY[c.attn_implementation])
    compute = (linear + attn) / (LIGER_SPEEDUP if c.liger_kernel else 1.0)
    compute /= PURE_BF16_SPEEDUP if c.precision == "pure_bf16" else 1.0
    wb, gb, _ = state_bytes(c)
    share = (n - 1) / n
    strategy = c.fsdp_sharding_strategy if c.distributed_backend == "FSDP" else "DDP"
    volume = {"FULL_SHARD": (2 * 2 + gb) * p * share, "SHARD_GRAD_OP": (2 + gb) * p * share}.get(
        strategy, 2 * gb * p * share
    )
    comm = volume / BANDWIDTH if n > 1 else 0.0
    offload = (wb + gb) * p / n / PCIE + p / n / CPU_ADAM if c.fsdp_cpu_offload else 0.0
    comm *= 1 / 1.05 if c.fsdp_version == 2 else 1.0
    return compute * OPTIM_TIME[c.optim] + (1 - OVERLAP) * comm + offload


KNOB_COLUMNS = (
    "checkpoint_fraction",
    "fsdp_cpu_offload",
    "padding",
    "attn_implementation",
    "precision",
    "liger_kernel",
    "optim",
)


def knobs_row(m: Model, w: Work, c: Any) -> dict:
    mem = knobs_memory_gib(m, c, w)
    fits = mem <= 0.9 * 80
    fsdp = c.distributed_backend == "FSDP"
    row = {
        "model_name": m.name,
        "gpu_model": GPU,
        "model_max_length": c.model_max_length,
        "number_gpus": c.number_gpus,
        "batch_size": c.batch_size,
        "gradient_checkpointing": c.gradient_checkpointing,
        "distributed_backend": c.distributed_backend,
        "fsdp_version": c.fsdp_version if fsdp else "",
        "fsdp_sharding_strategy": c.fsdp_sharding_strategy if fsdp else "",
    }
    row |= {k: getattr(c, k) for k in KNOB_COLUMNS}
    row["checkpoint_fraction"] = c.checkpoint_fraction if c.gradient_checkpointing else ""
    row["fsdp_cpu_offload"] = c.fsdp_cpu_offload if fsdp else ""
    tput = w.dataset / knobs_step_seconds(m, c, w)
    row |= {
        "dataset_tokens_per_second_per_gpu": round(tput, 1) if fits else 0.0,
        "peak_memory_gib": round(mem, 2),
        "is_valid": int(fits),
    }
    return row


def knobs_rows() -> list[dict]:
    """A row for every valid configuration of the knobs study's space."""
    from explorer.study_file import load_study
    from explorer.validity import invalid_reason

    loaded = load_study(KNOBS_STUDY, check_model=False)
    lengths = Lengths.of_study()
    m = MODELS["granite-3.1-2b"]
    works: dict[tuple[str, int, int], Work] = {}
    rows = []
    for c in loaded.space.enumerate():
        if invalid_reason(c, loaded.spec.resources) is not None:
            continue
        at = (c.padding, c.batch_size // c.number_gpus, c.model_max_length)
        if at not in works:
            works[at] = work(lengths, padding=at[0], b=at[1], seq=at[2])
        rows.append(knobs_row(m, works[at], c))
    return rows


def write_tables(only: tuple[str, ...] = ()) -> list[Path]:
    """Write the modelled tables (``only``: those file names)."""
    TABLES.mkdir(parents=True, exist_ok=True)
    makers: dict[str, Any] = {f"model-{m.name}.csv": (lambda m=m: model_rows(m)) for m in MODELS.values()}
    makers["model-granite-3.1-2b-wide.csv"] = lambda: model_rows(MODELS["granite-3.1-2b"], **WIDE)  # type: ignore[arg-type]
    makers[KNOBS_TABLE] = knobs_rows
    paths = []
    for name, make in makers.items():
        if only and name not in only:
            continue
        rows = make()
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


STUDIES = {
    "cpu-quickstart.csv": ROOT / "studies" / "cpu-table.yaml",
    "model-granite-3.1-2b.csv": ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b.yaml",
    "model-llama-3.1-8b.csv": ROOT / "benchmarks" / "search_studies" / "llama-3.1-8b.yaml",
}
"""The tables ``search`` runs by default, and their study files."""
OTHER_STUDIES = {KNOBS_TABLE: KNOBS_STUDY}
"""Tables ``search`` runs only when named (``--tables``)."""


def search(
    repeats: int,
    n_trials: int,
    first_seed: int = 0,
    *,
    tables: tuple[str, ...] = (),
    variants: tuple[str, ...] = (),
    out: str | None = None,
) -> dict:
    """benchmark-search over ``tables`` (default: :data:`STUDIES`) with ``variants`` (default:
    all), written to ``benchmarks/results/<out>`` (default: ``search_benchmark[.seedsN].json``)."""
    import time

    from explorer.search_benchmark import VARIANTS, benchmark_search, format_table, to_json
    from explorer.study_file import load_study

    studies = {t: (STUDIES | OTHER_STUDIES)[t] for t in tables} if tables else STUDIES
    result = {}
    for table, study in studies.items():
        loaded = load_study(study, replay_table=TABLES / table)
        start = time.monotonic()
        figures = benchmark_search(
            loaded, repeats=repeats, n_trials=n_trials, first_seed=first_seed, variants=variants or VARIANTS
        )
        print(format_table(figures), flush=True)
        result[table] = json.loads(to_json(figures))
        if tables:  # a run of its own records how long it took (the default files never did)
            result[table]["seconds"] = round(time.monotonic() - start, 1)
    name = out or ("search_benchmark.json" if first_seed == 0 else f"search_benchmark.seeds{first_seed}.json")
    path = ROOT / "benchmarks" / "results" / name
    path.write_text(json.dumps(result, indent=2))
    return result


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
    parser.add_argument(
        "--tables",
        nargs="+",
        default=[],
        help=f"tables: write only these; search: run only these (default: {', '.join(STUDIES)}; "
        f"also {', '.join(OTHER_STUDIES)})",
    )
    parser.add_argument("--variants", nargs="+", default=[], help="search: only these variants")
    parser.add_argument("--out", help="search: the result file's name under benchmarks/results/")
    args = parser.parse_args()
    if args.what == "tables":
        write_tables(tuple(args.tables))
    elif args.what == "remeasure":
        remeasure(args.rounds)
    else:
        search(
            args.repeats,
            args.n_trials,
            args.first_seed,
            tables=tuple(args.tables),
            variants=tuple(args.variants),
            out=args.out,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
