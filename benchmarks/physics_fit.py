"""Fit and check the search's physics (explorer/search/_physics.py) on the public measurements.

Each usable row of ``benchmarks/evidence/measurements.csv`` becomes a study's workload and
resources and one :class:`~explorer.trial_config.TrialConfig`; the predicted tokens/s per GPU and
peak memory are the package's own :class:`~explorer.search._physics.JobPhysics` (nothing of the
physics is copied here). The rows are split once, by a fixed rule written below (model family
and source, :func:`part_of`): the constants are fitted on the ``fit`` part only and the
``held`` part is reported apart.

    .venv/bin/python benchmarks/physics_fit.py            # figures of the package's constants
    .venv/bin/python benchmarks/physics_fit.py --fit      # also least-squares constants (fit part)
    .venv/bin/python benchmarks/physics_fit.py --write    # write the results files

``--write`` writes ``benchmarks/results/physics_fit.json`` (constants, split, figures, every
point) and ``benchmarks/results/physics_evidence.csv`` (one row a point);
``tests/test_physics_evidence.py`` recomputes both from the package's current code.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from explorer.search import _calibrate  # noqa: E402
from explorer.search import _physics as physics  # noqa: E402
from explorer.spec import ResourcesSpec, WorkloadSpec  # noqa: E402
from explorer.trial_config import TrialConfig  # noqa: E402

CSV = ROOT / "benchmarks/evidence/measurements.csv"
JSON_OUT = ROOT / "benchmarks/results/physics_fit.json"
CSV_OUT = ROOT / "benchmarks/results/physics_evidence.csv"

STARTS = {
    "MFU_REF": 0.62,
    "MFU_ALPHA": 0.55,
    "HALF_HIDDEN": 600.0,
    "HALF_TOKENS": 4096.0,
    "OVERLAP": 0.7,
    "ACTIVATION_BASE": 20.0,
    "COMPILE_ACTIVATION": 0.72,
    "LOGIT_BYTES": 8.0,
    "RESERVED_SLACK": 0.10,
}
"""The constants of :mod:`explorer.search._physics` that the evidence fits, and the sourced values
the fit starts from and is held near (each constant's docstring there says where they come from:
llm-foundry's and torchtitan's MFU for the efficiency, Korthikanti et al. for the activations,
the previous prior for the step tokens' half point and the overlap)."""
UPPER = {"MFU_REF": 1.0, "OVERLAP": 1.0}
"""Bounds that physics sets: no more than the peak at the reference card, and communication hidden
behind at most all of the compute."""
FITTED = tuple(STARTS)
SOURCED = (
    "ACTIVATION_MLP",
    "CONTEXT_GIB",
    "COMPILE_SPEED",
    "SCORE_BYTES",
    "FLOPS_PER_BYTE_REF",
    "NVLINK_BYTES_S",
    "INTER_NODE_BYTES_S",
    "CUDA_SHARE_HBM",
    "CUDA_SHARE_GDDR",
    "STEP_OVERHEAD_S",
)
"""The constants that come from a source, not a fit (recorded beside the fitted ones)."""

# ---------------------------------------------------------------------------------------------
# Shapes the CSV does not carry (heads, key-value heads, tied embeddings, the MLP's kind), from
# each model's HF config / llm-foundry's MPT yamls.
# name prefix -> (heads, kv heads, tied, gated MLP)
SHAPES: dict[str, tuple[int | None, int | None, bool, bool]] = {
    "MPT-": (None, None, True, False),  # heads = hidden / 128 (64 for 125m/350m); no GQA
    "Llama 3": (None, 8, False, True),
    "Llama 2 13B": (40, 40, False, True),
    "Llama 2 70B": (64, 8, False, True),
    "Qwen2.5": (None, 8, False, True),
    "granite-3.1-2b": (32, 8, True, True),
    "SmolLM2-360M": (15, 5, True, True),
    "bigscience/bloomz-7b1": (32, 32, True, False),
}

GPUS = {
    "A100 40GB SXM4 (assumed)": ("NVIDIA-A100-SXM4-40GB", None),
    "A100 80GB SXM4 (assumed)": ("NVIDIA-A100-SXM4-80GB", None),
    "A100 80GB SXM4": ("NVIDIA-A100-SXM4-80GB", None),
    "A100 80GB": ("NVIDIA-A100-SXM4-80GB", None),
    "A100 (80GB assumed)": ("NVIDIA-A100-SXM4-80GB", None),
    "A100 (80GB per examples README)": ("NVIDIA-A100-SXM4-80GB", None),
    "H100 80GB SXM (assumed)": ("NVIDIA-H100-80GB-HBM3", None),
    "H100 80GB SXM (HBM3)": ("NVIDIA-H100-80GB-HBM3", None),
    "H100 80GB": ("NVIDIA-H100-80GB-HBM3", None),
    "GB200 (186 GB)": ("NVIDIA-GB200", None),
    "H200 SXM 141GB": ("NVIDIA-H200", None),
    # Grand Teton's H100: 96 GB HBM2e (six 16 GiB stacks), CUDA total not published: 95 GiB taken
    "H100 96GB HBM2e SXM at 500 W (Grand Teton)": ("NVIDIA-H100-80GB-HBM3", {"memory_gib": 95.0}),
}
"""The CSV's GPU descriptions -> the table's label and figures declared over the table's row."""

HELD_FAMILIES = ("MPT-7b", "MPT-30b", "Llama 2", "granite", "Qwen2.5-32B")
"""The split, fixed: every row of these model families is held back (MPT-7b and MPT-30b sit
between the fitted MPT sizes; Llama 2 comes only from torchtitan's A100 tables; granite and Qwen
from seeds 000 and 004), and so are torchtitan's 128-GPU (multi-node) Llama 3.1 8B pair."""
HELD_IDS = frozenset({228, 229})
BF16_LOSS_LOGIT_BYTES = 8.0
"""The logits' bytes a token and vocabulary entry where a run takes the cross-entropy of the bf16
logits outside the model (IDRIS's ``FSDP_sAC.py``): the logits and their log-softmax in bf16, both
kept through the backward, and the two gradients, 4 x 2 bytes; the HF model's own loss upcasts to
fp32 first (the physics' ``LOGIT_BYTES``)."""
SAC_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
SELECTIVE_OP = 0.75
"""torchtitan's per-op selective checkpointing as explorer's fraction of layers checkpointed."""
"""The selective-checkpointing ratios seed 004 chooses among."""


@dataclass(frozen=True)
class Point:
    """One measured configuration, mapped to the physics."""

    id: int
    part: str
    label: str
    workload: WorkloadSpec
    resources: ResourcesSpec
    config: TrialConfig
    tokens_s: float | None
    peak_gib: float | None
    """The measured peak as the caching allocator reserved it (or as NVML saw it)."""
    allocated_gib: float | None
    """The measured peak of the tensors alone (``torch.cuda.max_memory_allocated``)."""
    logit_bytes: float | None
    """Bytes a token and vocabulary entry of the logits where the run's loss differs from the HF
    model's own (``None``: the physics' :data:`LOGIT_BYTES`)."""
    fits: bool | None
    """The measured verdict: a peak, an OOM or a stated fit (``None``: only a throughput, whose
    run fitted with kernels and a batch tuned to the limit that the row does not detail)."""
    source: str

    def physics(self) -> physics.JobPhysics:
        job = _JOBS.get(self.id)
        if job is None:
            job = _JOBS[self.id] = physics.JobPhysics(workload=self.workload, resources=self.resources)
        return job


_JOBS: dict[int, physics.JobPhysics] = {}
"""One physics a point (its constants are read at each call, so a fit may change them)."""


def _shape(model: str) -> tuple[int | None, int | None, bool, bool] | None:
    return next((v for k, v in SHAPES.items() if model.startswith(k)), None)


def architecture(row: dict[str, str]) -> dict[str, Any] | None:
    """An HF-style architecture for the physics, or ``None``: the CSV lacks the shape."""
    shape = _shape(row["model"])
    if shape is None or not row["layers"].isdigit():
        return None
    heads, kv, tied, gated = shape
    hidden, ffn = int(row["hidden"]), int(row["ffn"])
    if heads is None:
        heads = hidden // 64 if hidden <= 1024 else hidden // 128
    return {
        "model_type": "granite" if row["model"].startswith("granite") else "llama" if gated else "mpt",
        "hidden_size": hidden,
        "num_hidden_layers": int(row["layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv or heads,
        "intermediate_size": ffn,
        "vocab_size": int(row["vocab"]),
        "tie_word_embeddings": tied,
    }


def _checkpointing(text: str) -> float | None:
    """The fraction of layers checkpointed (0: off); ``None``: not stated."""
    t = text.lower()
    if t.startswith("none"):
        return 0.0
    if "ratio" in t:
        a, _, b = t.split("ratio", 1)[1].strip().partition("/")
        return float(a) / float(b or 1)
    if t.startswith("selective"):
        # torchtitan: "per layer" checkpoints every 2nd layer; "per op" (its default) keeps every
        # other matmul's output and attention's (q, v, the MLP's first and last product, the
        # attention output: about 6.5 x hidden + 2 x intermediate bytes a token of Llama's ~53),
        # about a quarter of a layer's activations: as if three layers in four were checkpointed
        return 0.5 if "per layer" in t else SELECTIVE_OP
    if t.startswith(("full", "on")):
        return 1.0
    return None


def _precision(row: dict[str, str]) -> str:
    p, src = row["precision"], row["source"]
    if "PURE" in p or "pure bf16" in p or src.startswith("seed 000"):
        return "pure_bf16"  # FSDP PURE, torchtune's bf16 weights, fms-hf-tuning's bf16 model
    return "mixed"


def _optim(row: dict[str, str]) -> str:
    src = row["source"]
    if src.startswith(("torchtitan", "llm-foundry")) or "adamw_torch_fused" in row["optimizer"]:
        return "adamw_torch_fused"  # torchtitan's default implementation "fused"; Composer's loop
    return "adamw_torch"


def _attention(row: dict[str, str]) -> str:
    a = row["attention"].lower()
    if "flash" in a or "te)" in a:
        return "flash_attention_2"
    return "eager" if a.startswith("eager") else "sdpa"


def usable(row: dict[str, str]) -> str | None:
    """Why a row is left out (``None``: used)."""
    if row["source"].startswith(("torchtune", "Megatron", "seed 003", "HF PEFT")) and not row[
        "model"
    ].startswith("bigscience/bloomz"):
        return "source not mapped (suspect tokens/s, no shape, or encoder-decoder)"
    if "float8" in row["precision"] or "fp8" in row["precision"]:
        return "float8 (not modelled)"
    if any(row[k] not in ("1", "") for k in ("tp", "pp", "cp")):
        return "tensor/pipeline/context parallel (not modelled)"
    if not row["micro_batch_per_gpu"].isdigit() and not row["source"].startswith("HF PEFT"):
        return "micro batch not stated"
    if row["gpu"] not in GPUS:
        return "GPU not mapped"
    if architecture(row) is None:
        return "no shape"
    if _checkpointing(row["activation_checkpointing"]) is None and not row["model"].startswith("big"):
        return "checkpointing not stated"
    return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def part_of(row: dict[str, str]) -> str:
    """``held`` or ``fit``, by the fixed rule of :data:`HELD_FAMILIES` and :data:`HELD_IDS`."""
    held = int(row["id"]) in HELD_IDS or row["model"].startswith(HELD_FAMILIES)
    return "held" if held else "fit"


def point(row: dict[str, str]) -> Point:
    """The physics' view of a usable row."""
    peft = row["source"].startswith("HF PEFT")
    seq = 64 if peft else int(row["seq_len"])  # PEFT's twitter_complaints example: 64 tokens, batch 8
    micro = 8 if peft else int(row["micro_batch_per_gpu"] or 1)
    gpus, nodes = int(row["num_gpus"] or 1), int(row["nodes"] or 1)
    if "NVL72" in row["inter_node"]:  # one NVLink domain across the rack's nodes: as one node
        nodes = 1
    label, declared = GPUS[row["gpu"]]
    lora = "LoRA" in row["workload"]
    method: dict[str, Any] = {"kind": "lora", "r": 8, "target_modules": ["query_key_value"]} if lora else {}
    workload = WorkloadSpec.model_validate(
        {
            "model": {"name": row["model"], "architecture": architecture(row)},
            "dataset": {"kind": "synthetic", "min_tokens": seq},
            "model_max_length": seq,
            "method": method or {"kind": "full"},
        }
    )
    cap = 40.0 if row["source"].startswith("project H100") else None  # the study's per-process cap
    resources = ResourcesSpec.model_validate(
        {
            "gpu_model": label,
            "gpus_per_node": max(1, gpus // nodes),
            "nodes": nodes,
            "device": "cuda",
            "gpu": declared,
            "device_memory_gib": cap,
        }
    )
    fraction = _checkpointing(row["activation_checkpointing"]) or 0.0
    sharding = row["sharding"]
    backend = None if gpus == 1 else "FSDP"
    config = TrialConfig(
        batch_size=micro * gpus,
        number_gpus=gpus,
        number_nodes=nodes,
        distributed_backend=backend,
        fsdp_sharding_strategy=("SHARD_GRAD_OP" if "SHARD_GRAD_OP" in sharding else "FULL_SHARD")
        if backend
        else None,
        fsdp_version=(2 if sharding.startswith("FSDP2") else 1) if backend else None,
        gradient_checkpointing=fraction > 0,
        checkpoint_fraction=fraction if fraction > 0 else 1.0,
        model_max_length=seq,
        torch_compile=row["compile"].startswith("yes"),
        precision=_precision(row),
        optim=_optim(row),
        attn_implementation=_attention(row),
        liger_kernel="Liger" in row["other_metric"] and "+ Liger" in row["other_metric"],
        lora_r=8 if lora else None,
        gpu_model=label,
    )
    other = (row["other_metric"] + " " + row["peak_memory_kind"]).lower()
    oom = "oom" in other and "fits" not in other
    measured_peak = _number(row["peak_memory_gib"])
    allocated = _allocated(row["peak_memory_kind"], measured_peak)
    if allocated is not None and "max_memory_allocated" in row["peak_memory_kind"]:
        measured_peak = None  # the row's peak is the tensors' alone
    fits = False if oom else True if measured_peak or allocated or "fit" in other else None
    return Point(
        id=int(row["id"]),
        part=part_of(row),
        label=f"{row['model']} {row['gpu'].split(' (')[0]} x{gpus} seq{seq} mb{micro}",
        workload=workload,
        resources=resources,
        config=config,
        tokens_s=_number(row["tokens_per_s_per_gpu"]),
        peak_gib=None if lora and peft else measured_peak,
        allocated_gib=allocated,
        logit_bytes=BF16_LOSS_LOGIT_BYTES if "on bf16 logits" in row["notes"] else None,
        fits=fits,
        source=" ".join(row["source"].split()[:2]) + " runs"
        if row["source"].startswith("project")
        else row["source"].split(":")[0],
    )


def _allocated(kind: str, peak: float | None) -> float | None:
    """The allocated peak a row states: the row's peak measured by ``max_memory_allocated``, or the
    ``(allocated X GiB)`` beside a reserved one."""
    if "max_memory_allocated" in kind:
        return peak
    found = re.search(r"allocated ([0-9.]+) GiB", kind)
    return float(found.group(1)) if found else None


def points() -> tuple[list[Point], dict[int, str]]:
    """The usable rows as points, and why each other row is left out."""
    rows = list(csv.DictReader(CSV.open()))
    used, skipped = [], {}
    for row in rows:
        why = usable(row)
        if why is None:
            used.append(point(row))
        else:
            skipped[int(row["id"])] = why
    return used, skipped


def predict(p: Point) -> dict[str, Any]:
    """The package's predictions for one point."""
    job = p.physics()
    saved = physics.LOGIT_BYTES
    if p.logit_bytes is not None:
        physics.LOGIT_BYTES = p.logit_bytes
    try:
        memory, allocated = job.memory_gib(p.config), job.allocated_gib(p.config)
    finally:
        physics.LOGIT_BYTES = saved
    limit = job.limit_gib
    return {
        "tokens_s": math.exp(job.log_throughput(p.config)),
        "peak_gib": memory,
        "allocated_gib": allocated,
        "limit_gib": limit,
        "fits": None if limit is None else bool(memory <= limit),
    }


# ---------------------------------------------------------------------------------------------
# Figures


def summary(ratios: list[float]) -> dict[str, Any]:
    """Median, the quartiles (half the points within), the worst factor either way."""
    if not ratios:
        return {"n": 0}
    qs = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {
        "n": len(ratios),
        "median": round(statistics.median(ratios), 4),
        "q1": round(qs[0], 4),
        "q3": round(qs[2], 4),
        "min": round(min(ratios), 4),
        "max": round(max(ratios), 4),
        "worst_factor": round(max(max(ratios), 1 / min(ratios)), 4),
        "within_2x": sum(0.5 <= r <= 2.0 for r in ratios),
    }


MEMORY_KINDS = ("memory", "allocated")
"""Peaks measured as reserved (or by NVML), and as allocated: each against its own estimate."""


def figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput and memory summaries and fit/OOM agreement, per part."""
    out: dict[str, Any] = {}
    for part in ("fit", "held", "all"):
        rs = [r for r in records if part in ("all", r["part"])]
        verdicts = {
            r["id"]: r for r in rs if r["fits_measured"] is not None and r["fits_predicted"] is not None
        }
        agree = list(verdicts.values())  # one verdict a point, whichever values it has
        out[part] = {
            "throughput": summary([r["ratio"] for r in rs if r["kind"] == "throughput"]),
            "memory": summary([r["ratio"] for r in rs if r["kind"] in MEMORY_KINDS]),
            "fits_agree": sum(r["fits_measured"] == r["fits_predicted"] for r in agree),
            "fits_points": len(agree),
            "ran_but_predicted_oom": sum(
                r["kind"] == "throughput" and r["fits_measured"] is None and r["fits_predicted"] is False
                for r in rs
            ),
        }
    return out


def records(pts: list[Point]) -> list[dict[str, Any]]:
    """One record a measured value (throughput, peak) or feasibility-only point."""
    out = []
    for p in pts:
        pred = predict(p)
        base = {"id": p.id, "part": p.part, "label": p.label, "fits_predicted": pred["fits"]}
        base["source"] = p.source
        limit = pred["limit_gib"]
        base["headroom"] = None if limit is None else round(limit / pred["peak_gib"] - 1, 5)
        base["fits_measured"] = p.fits
        kinds = [
            ("throughput", p.tokens_s, pred["tokens_s"]),
            ("memory", p.peak_gib, pred["peak_gib"]),
            ("allocated", p.allocated_gib, pred["allocated_gib"]),
        ]
        measured_any = False
        for kind, measured, predicted in kinds:
            if measured:
                measured_any = True
                out.append(
                    {
                        **base,
                        "kind": kind,
                        "predicted": round(predicted, 4),
                        "measured": measured,
                        "ratio": round(predicted / measured, 4),
                    }
                )
        if not measured_any:
            out.append({**base, "kind": "feasibility", "predicted": round(pred["peak_gib"], 4)})
            out[-1].update({"measured": None, "ratio": None})
    return out


# ---------------------------------------------------------------------------------------------
# An allocator margin: what a share more of memory on every estimate would do to the verdicts

MARGINS = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05)
"""The margins :func:`margin_tradeoff` prices: an estimate ``1 + m`` times the physics' (memory the
caching allocator keeps in split blocks), and the verdict ``fits`` where ``headroom >= m``."""


def margin_tradeoff(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """From each point's ``headroom`` (the limit over the estimate, less 1): per part, the margins
    that get every measured verdict right (the largest headroom of an OOM up to the smallest of a
    fit; ``None`` when no margin does), and per margin, the wrong verdicts and the runs that ran
    (throughput only, their kernels and batch tuned to the limit) that it predicts out of memory."""
    one = {r["id"]: r for r in recs if r["headroom"] is not None}  # one verdict a point
    out: dict[str, Any] = {}
    for part in ("fit", "held"):
        rs = [r for r in one.values() if r["part"] == part]
        ooms = [r["headroom"] for r in rs if r["fits_measured"] is False]
        fits = [r["headroom"] for r in rs if r["fits_measured"] is True]
        low, high = max(ooms, default=-math.inf), min(fits, default=math.inf)
        ran = [r["headroom"] for r in rs if r["fits_measured"] is None and r["kind"] == "throughput"]
        out[part] = {
            "all_right": _interval(low, high),
            "by_margin": {
                str(m): {
                    "wrong": sum(h < m for h in fits) + sum(h >= m for h in ooms),
                    "ran_predicted_oom": sum(h < m for h in ran),
                }
                for m in MARGINS
            },
        }
    return out


def _interval(low: float, high: float) -> list[float | None] | None:
    """``[low, high]`` rounded, an unbounded side ``None``; ``None`` if empty."""
    if low >= high:
        return None
    return [None if math.isinf(low) else round(low, 4), None if math.isinf(high) else round(high, 4)]


def seed_004_margins(cells: list[dict[str, Any]]) -> list[float | None] | None:
    """The margins at which every seed 004 cell's smallest fitting ratio is the seed's: the seed's
    ratio fits, the next smaller one does not."""
    low, high = -math.inf, math.inf
    for c in cells:
        limit, est = c["limit_gib"], {float(k): v for k, v in c["estimate_gib"].items()}
        high = min(high, limit / est[c["seed_ratio"]] - 1)
        smaller = [r for r in SAC_GRID if r < c["seed_ratio"]]
        if smaller:
            low = max(low, limit / est[max(smaller)] - 1)
    return _interval(low, high)


# ---------------------------------------------------------------------------------------------
# Seed 004: the smallest selective-checkpointing ratio that fits, per model and GPU

SEED_004 = {
    ("Qwen2.5-14B", "NVIDIA-A100-SXM4-80GB"): 0.5,
    ("Qwen2.5-14B", "NVIDIA-H100-80GB-HBM3"): 0.5,
    ("Qwen2.5-14B", "NVIDIA-GB200"): 0.0,
    ("Qwen2.5-32B", "NVIDIA-A100-SXM4-80GB"): 0.75,
    ("Qwen2.5-32B", "NVIDIA-H100-80GB-HBM3"): 0.75,
    ("Qwen2.5-32B", "NVIDIA-GB200"): 0.0,
    ("Qwen2.5-72B", "NVIDIA-A100-SXM4-80GB"): 1.0,
    ("Qwen2.5-72B", "NVIDIA-H100-80GB-HBM3"): 1.0,
    ("Qwen2.5-72B", "NVIDIA-GB200"): 0.5,
}
"""Seed 004's table: 64 GPUs, global batch 128 (2 a GPU), 4096 tokens, bf16-mixed, FSDP2, compile."""
QWEN = {
    "Qwen2.5-14B": {"layers": "48", "hidden": "5120", "ffn": "13824", "vocab": "152064"},
    "Qwen2.5-32B": {"layers": "64", "hidden": "5120", "ffn": "27648", "vocab": "152064"},
    "Qwen2.5-72B": {"layers": "80", "hidden": "8192", "ffn": "29568", "vocab": "152064"},
}
"""Qwen2.5's shapes (HF configs, as in measurements.csv rows 275-286); heads 40/40/64, 8 KV heads."""


def seed_004_job(model: str, gpu: str) -> physics.JobPhysics:
    """The physics of one seed 004 cell: 64 GPUs, four a node on H100 and GB200, else eight."""
    row = {"model": model, **QWEN[model]}
    arch = architecture(row)
    arch["num_attention_heads"] = 64 if model.endswith("72B") else 40
    workload = WorkloadSpec.model_validate(
        {
            "model": {"name": model, "architecture": arch},
            "dataset": {"kind": "synthetic", "min_tokens": 4096},
            "model_max_length": 4096,
        }
    )
    per_node = _per_node(gpu)
    resources = ResourcesSpec.model_validate(
        {"gpu_model": gpu, "gpus_per_node": per_node, "nodes": 64 // per_node, "device": "cuda"}
    )
    return physics.JobPhysics(workload=workload, resources=resources)


def _per_node(gpu: str) -> int:
    return 4 if "GB200" in gpu or "H100" in gpu else 8


def seed_004_config(gpu: str, ratio: float, length: int = 4096) -> TrialConfig:
    """Seed 004's configuration at a selective-checkpointing ratio: 2 sequences a GPU."""
    return TrialConfig(
        batch_size=128,
        number_gpus=64,
        number_nodes=64 // _per_node(gpu),
        distributed_backend="FSDP",
        fsdp_sharding_strategy="FULL_SHARD",
        gradient_checkpointing=ratio > 0,
        checkpoint_fraction=ratio if ratio > 0 else 1.0,
        model_max_length=length,
        torch_compile=True,
        optim="adamw_torch",
        gpu_model=gpu,
    )


def _longest_fitting(job: physics.JobPhysics, gpu: str, ratio: float, most: int = 4096) -> int:
    """The longest sequences (up to ``most``) at which the cell fits at ``ratio`` (0: none), by
    bisection: the estimate grows with the length."""
    limit = job.limit_gib or math.inf
    low, high = 0, most  # low fits (or is 0); the answer is at most high
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (
            (mid, high) if job.memory_gib(seed_004_config(gpu, ratio, mid)) <= limit else (low, mid - 1)
        )
    return low


def seed_004() -> list[dict[str, Any]]:
    """Per cell: the seed's ratio, the physics' smallest fitting ratio, each ratio's estimate, and
    the longest sequences at which the seed's ratio fits."""
    out = []
    for (model, gpu), seed in SEED_004.items():
        job = seed_004_job(model, gpu)
        limit = job.limit_gib or math.inf
        gib = {ratio: round(job.memory_gib(seed_004_config(gpu, ratio)), 3) for ratio in SAC_GRID}
        fitting = [r for r in SAC_GRID if gib[r] <= limit]
        predicted = min(fitting) if fitting else None
        longest = _longest_fitting(job, gpu, seed)
        out.append(
            {
                "model": model,
                "gpu": gpu,
                "seed_ratio": seed,
                "predicted_ratio": predicted,
                "agree": predicted == seed,
                "limit_gib": job.limit_gib,
                "estimate_gib": {str(k): v for k, v in gib.items()},
                "seed_ratio_fits_up_to_tokens": longest,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# The fit: least squares in log space on the fit part, the constants set on the module


KNOB_BACKED = {
    "COMPILE_SPEED": ("torch_compile", "efficiency", True),
    "COMPILE_ACTIVATION": ("torch_compile", "activation_share", True),
}
"""Constants that the knob registry declares (a knob's table entry), by name here."""


def _knob_table(name: str) -> tuple[dict[Any, float], Any]:
    from explorer.knobs import knob

    knob_name, field, value = KNOB_BACKED[name]
    return getattr(knob(knob_name), field), value


def _get(name: str) -> float:
    if name in KNOB_BACKED:
        table, value = _knob_table(name)
        return float(table[value])
    return getattr(_calibrate if hasattr(_calibrate, name) else physics, name)


def _set(values: dict[str, float]) -> None:
    """Set constants where the physics reads them (the overlap lives in ``_calibrate``, compile's
    figures in the knob registry)."""
    for k, v in values.items():
        if k in KNOB_BACKED:
            table, value = _knob_table(k)
            table[value] = v
        else:
            setattr(_calibrate if hasattr(_calibrate, k) else physics, k, v)


THROUGHPUT_FITTED = ("MFU_REF", "MFU_ALPHA", "HALF_HIDDEN", "HALF_TOKENS")
"""The throughput constants fitted (``OVERLAP`` is recorded, not refitted: :mod:`explorer.search._calibrate`)."""
MEMORY_FITTED = ("ACTIVATION_BASE", "COMPILE_ACTIVATION", "LOGIT_BYTES", "RESERVED_SLACK")
PRIOR_SD = {"throughput": 2.0, "memory": 1.0}
"""Each fitted constant's log-normal prior around its sourced starting value, by group: the
throughput's width is the one of :data:`PRIOR_CHOICES` with the least error when each source of the
fit part is left out in turn and predicted by a fit on the others (:func:`choose_prior`, in
``physics_fit.json``'s ``prior_choice``; the held-back part plays no part); the memory's stays a
factor of e."""
PRIOR_CHOICES = (0.5, 1.0, 2.0, 3.0, 5.0)
WEIGHT_POWER = 0.5
"""A source of n rows weighs n^(1 - this): between one a row (0) and one a source (1)."""


def _residuals(p: Point, weight: float, group: tuple[str, ...]) -> list[float]:
    pred, w = predict(p), math.sqrt(weight)
    if group is THROUGHPUT_FITTED:
        return [w * math.log(pred["tokens_s"] / p.tokens_s)] if p.tokens_s else []
    out = [2 * w * math.log(pred["peak_gib"] / p.peak_gib)] if p.peak_gib else []
    if p.allocated_gib:
        out.append(2 * w * math.log(pred["allocated_gib"] / p.allocated_gib))
    if p.fits is not None and pred["limit_gib"]:
        gap = math.log(pred["peak_gib"] / pred["limit_gib"])
        out.append(2 * w * (max(0.0, gap) if p.fits else max(0.0, -gap)))
    return out


def _fit_group(train: list[Point], group: tuple[str, ...], prior_sd: float | None = None) -> dict[str, float]:
    """One group's least-squares constants (the module's constants restored after), each within
    its :data:`UPPER` bound."""
    from scipy.optimize import least_squares

    sd = prior_sd or PRIOR_SD["throughput" if group is THROUGHPUT_FITTED else "memory"]
    used = [p for p in train if _residuals(p, 1.0, group)]
    per_source: dict[str, int] = {}
    for p in used:
        per_source[p.source] = per_source.get(p.source, 0) + 1
    weight = {k: 1.0 / n**WEIGHT_POWER for k, n in per_source.items()}
    start = {k: STARTS[k] for k in group}
    saved = {k: float(_get(k)) for k in group}

    def resid(u: Any) -> list[float]:
        _set({k: start[k] * math.exp(x) for k, x in zip(group, u, strict=True)})
        out = [r for p in used for r in _residuals(p, weight[p.source], group)]
        return out + [x / sd for x in u]

    upper = [math.log(UPPER[k] / start[k]) if k in UPPER else math.inf for k in group]
    result = least_squares(resid, [0.0] * len(group), bounds=([-math.inf] * len(group), upper))
    _set(saved)
    return {k: start[k] * math.exp(x) for k, x in zip(group, result.x, strict=True)}


def choose_prior(pts: list[Point]) -> dict[str, Any]:
    """For each of :data:`PRIOR_CHOICES`: each source of the fit part left out in turn, the
    throughput constants fitted on the others, and the median absolute log error on the left-out
    source; the mean over sources, and the width with the least."""
    train = [p for p in pts if p.part == "fit" and _residuals(p, 1.0, THROUGHPUT_FITTED)]
    sources = sorted({p.source for p in train})
    saved = {k: float(_get(k)) for k in THROUGHPUT_FITTED}
    errors: dict[str, dict[str, float]] = {}
    for sd in PRIOR_CHOICES:
        by_source = {}
        for s in sources:
            _set(_fit_group([p for p in train if p.source != s], THROUGHPUT_FITTED, sd))
            out = [abs(math.log(predict(p)["tokens_s"] / p.tokens_s)) for p in train if p.source == s]
            by_source[s] = round(statistics.median(out), 4)
        errors[str(sd)] = {"mean": round(statistics.mean(by_source.values()), 4), **by_source}
    _set(saved)
    best = min(PRIOR_CHOICES, key=lambda sd: errors[str(sd)]["mean"])
    return {"errors": errors, "chosen": best}


def fit(pts: list[Point]) -> dict[str, float]:
    """Least-squares constants on the ``fit`` part: log ratios of throughput and of peak memory,
    and for an OOM or a stated fit that the estimate gets wrong, its log distance to the limit;
    a source of many rows weighs less a row (:data:`WEIGHT_POWER`), each constant is held near
    its starting value (:data:`PRIOR_SD`). Throughput and memory constants apart."""
    train = [p for p in pts if p.part == "fit"]
    return {**_fit_group(train, THROUGHPUT_FITTED), **_fit_group(train, MEMORY_FITTED)}


def report(pts: list[Point], skipped: dict[int, str]) -> dict[str, Any]:
    recs = records(pts)
    cells = seed_004()
    return {
        "constants": {k: _get(k) for k in (*FITTED, *SOURCED)},
        "split": {
            "rule": "held back: every row of the model families "
            + ", ".join(HELD_FAMILIES)
            + f" and rows {sorted(HELD_IDS)} (torchtitan's 128-GPU Llama 3.1 8B pair); fit: the rest",
            "fit_ids": sorted({r["id"] for r in recs if r["part"] == "fit"}),
            "held_ids": sorted({r["id"] for r in recs if r["part"] == "held"}),
        },
        "figures": figures(recs),
        "seed_004": {"agree": sum(c["agree"] for c in cells), "cells": len(cells), "table": cells},
        "margin": {**margin_tradeoff(recs), "seed_004": seed_004_margins(cells)},
        "skipped": {str(k): v for k, v in sorted(skipped.items())},
        "points": recs,
    }


def write(out: dict[str, Any]) -> None:
    JSON_OUT.write_text(json.dumps(out, indent=1) + "\n")
    cols = [
        "id",
        "part",
        "kind",
        "label",
        "predicted",
        "measured",
        "ratio",
        "fits_predicted",
        "fits_measured",
        "headroom",
    ]
    with CSV_OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(out["points"])


def _print(out: dict[str, Any]) -> None:
    for part, fig in out["figures"].items():
        print(
            f"[{part}] fit/OOM {fig['fits_agree']}/{fig['fits_points']}; throughput-only rows "
            f"predicted OOM {fig['ran_but_predicted_oom']}"
        )
        for kind in ("throughput", "memory"):
            s = fig[kind]
            if s["n"]:
                print(
                    f"  {kind:10s} n={s['n']:3d} median {s['median']:.3f} half within "
                    f"{s['q1']:.3f}-{s['q3']:.3f} range {s['min']:.3f}-{s['max']:.3f} "
                    f"within 2x {s['within_2x']}/{s['n']}"
                )
    for part in ("fit", "held"):
        m = out["margin"][part]
        trade = ", ".join(
            f"{k}: {v['wrong']} wrong, {v['ran_predicted_oom']} ran" for k, v in m["by_margin"].items()
        )
        print(f"[{part}] allocator margin with every verdict right: {m['all_right']}; {trade}")
    print(f"allocator margin with every seed 004 cell right: {out['margin']['seed_004']}")
    seed = out["seed_004"]
    print(f"seed 004 sAC cells: {seed['agree']}/{seed['cells']} agree")
    for c in seed["table"]:
        longest = c["seed_ratio_fits_up_to_tokens"]
        fits = "" if longest == 4096 else f" (the seed's ratio fits sequences of up to {longest} tokens)"
        print(
            f"  {c['model']:12s} {c['gpu']:24s} seed {c['seed_ratio']} physics {c['predicted_ratio']}{fits}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="least-squares constants on the fit part")
    ap.add_argument("--write", action="store_true", help="write the results files")
    ap.add_argument("--points", action="store_true", help="print every point")
    ap.add_argument("--try-fitted", action="store_true", help="with --fit: report the fitted constants")
    args = ap.parse_args(argv)
    pts, skipped = points()
    if args.fit:
        fitted = fit(pts)
        for k, v in fitted.items():
            print(f"{k} = {v:.4g}  (package: {_get(k)})")
        if args.try_fitted:
            _set(fitted)
    out = report(pts, skipped)
    if args.points:
        for r in out["points"]:
            print(
                f"{r['id']:4d} {r['part']:4s} {r['kind']:11s} {r['label'][:60]:60s} "
                f"pred {r['predicted']} meas {r['measured']} ratio {r['ratio']} "
                f"fits {r['fits_predicted']}/{r['fits_measured']}"
            )
    _print(out)
    if args.write:
        out["prior_choice"] = choose_prior(pts)
        print(f"throughput prior width by leaving each fit source out: {out['prior_choice']}")
        write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
