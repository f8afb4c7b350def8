"""The first-principles priors of explorer/search/_physics.py and their calibration to measured
trials (explorer/search/_calibrate.py): directions that follow from the accounting, and scales
recovered from peaks and throughputs made with known multipliers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from explorer.search._calibrate import PhysicsParts, fit_memory_scales, fit_time_scales
from explorer.search._physics import JobPhysics, gpu_memory_gib, physics_parts
from explorer.study_file import load_study
from explorer.validity import invalid_reason

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def job():
    loaded = load_study(
        ROOT / "benchmarks/search_studies/knobs/llama-8b-h100x8-full-long.yaml", check_model=False
    )
    physics = JobPhysics(workload=loaded.spec.workload, resources=loaded.spec.resources)
    valid = [c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None]
    return physics, valid


def _pick(valid, **want):
    return next(c for c in valid if all(getattr(c, k) == v for k, v in want.items()))


def _fsdp_on_8(valid, **want):
    """FSDP FULL_SHARD on 8 GPUs, padded to max_length, without checkpointing or offload."""
    return _pick(
        valid,
        number_gpus=8,
        distributed_backend="FSDP",
        fsdp_sharding_strategy="FULL_SHARD",
        gradient_checkpointing=False,
        padding="max_length",
        fsdp_cpu_offload=False,
        **want,
    )


@pytest.mark.parametrize(
    ("name", "gib"),
    [
        ("NVIDIA-A100-SXM4-40GB", 40.0),
        ("NVIDIA-H100-80GB-HBM3", 80.0),
        ("NVIDIA-L40S", 48.0),
        ("NVIDIA H200", 141.0),
        ("NVIDIA L4", 24.0),
        ("NVIDIA-L40", 48.0),
        ("Tesla T4", 16.0),
        ("CPU-logical", None),
        (None, None),
    ],
)
def test_gpu_memory_from_the_name(name, gib):
    assert gpu_memory_gib(name) == gib


def test_the_parameter_count_is_llama_8b(job):
    physics, _ = job
    assert 7.9e9 < physics.arch.total < 8.2e9  # Llama-3.1-8B: 8.03e9


def test_memory_directions(job):
    """More sharding, checkpointing, Liger, pure bf16 and offload each need less memory."""
    physics, valid = job
    base = _pick(
        valid,
        number_gpus=8,
        distributed_backend="FSDP",
        fsdp_sharding_strategy="SHARD_GRAD_OP",
        gradient_checkpointing=False,
        liger_kernel=False,
        precision="mixed",
        fsdp_cpu_offload=False,
        padding="longest",
        attn_implementation="flash_attention_2",
        optim="adamw_torch_fused",
    )
    less = [
        base.replace(fsdp_sharding_strategy="FULL_SHARD"),
        base.replace(gradient_checkpointing=True),
        base.replace(liger_kernel=True),
        base.replace(precision="pure_bf16"),
        base.replace(fsdp_cpu_offload=True),
        base.replace(optim="adamw_bnb_8bit"),
    ]
    for c in less:
        assert physics.memory_gib(c) < physics.memory_gib(base), c
    # eager attention stores the scores; packing under eager carries a whole-row mask
    eager = base.replace(attn_implementation="eager")
    assert physics.memory_gib(eager) > physics.memory_gib(base)
    assert physics.memory_gib(eager.replace(padding="packed")) > physics.memory_gib(eager)


def test_liger_saves_one_of_the_gated_mlps_four_saved_tensors_its_rmsnorms_upcasts_and_the_logits(job):
    """Liger's SwiGLU keeps the gate and up projections only (down_proj keeps its input), and its
    RMSNorm its 16-bit input (8 bytes a token and hidden unit fewer): the saved activations lose a
    quarter of the MLP's share and those bytes, and its fused loss the logits."""
    from explorer.search import _physics

    physics, valid = job
    base = _pick(
        valid, gradient_checkpointing=False, liger_kernel=False, attn_implementation="flash_attention_2"
    )
    liger = base.replace(liger_kernel=True)
    _, acts, logits, _ = physics.memory_parts(base)
    _, acts_liger, logits_liger, _ = physics.memory_parts(liger)
    a = physics.arch
    assert not base.torch_compile  # compile's share (void under Liger) applies to neither
    share = _physics._activation_share(base)
    assert share == _physics._activation_share(liger)
    tokens = base.per_device_batch_size * base.model_max_length
    slack = physics.slack  # the allocator's, on the activations as reserved
    per_token = a.intermediate * _physics.ACTIVATION_MLP / 4 + 8.0 * a.hidden
    saved = a.layers * tokens * per_token * share * slack / _physics.GIB
    assert acts - acts_liger == pytest.approx(saved, rel=1e-9)
    assert logits > 0 and logits_liger == 0.0


def test_liger_on_granite_keeps_the_logits():
    """Liger's granite patch replaces torch's cross entropy, not the model's forward (granite
    scales its logits; the worker records ``loss: cross_entropy`` there): the logits are built,
    at Liger's 8 bytes a token and vocabulary entry against the model's own loss's 12."""
    from explorer.search import _physics

    loaded = load_study(ROOT / "studies/granite-3.1-2b-full-1xh100-throughput.yaml", check_model=False)
    physics = JobPhysics(workload=loaded.spec.workload, resources=loaded.spec.resources)
    assert physics.arch.fused_liger_loss is False
    valid = [c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None]
    base = _pick(valid, liger_kernel=False)
    _, _, logits, _ = physics.memory_parts(base)
    _, _, logits_liger, _ = physics.memory_parts(base.replace(liger_kernel=True))
    assert logits_liger / logits == pytest.approx(_physics.LIGER_CE_LOGIT_BYTES / _physics.LOGIT_BYTES)
    tokens = base.per_device_batch_size * base.model_max_length
    expected = tokens * physics.arch.vocab * _physics.LIGER_CE_LOGIT_BYTES * physics.slack / _physics.GIB
    assert logits_liger == pytest.approx(expected, rel=1e-9)


def test_gradients_are_freed_between_steps_unless_micro_steps_accumulate_them(job):
    """zero_grad(set_to_none=True) frees the gradients after each step: with one micro-step they
    fill only as the backward frees the activations (no cost while those exceed them); with two,
    they live through the next forward (one more gradient shard); DDP's buckets hold a copy always."""
    from explorer.search import _physics

    physics, valid = job
    base = _pick(
        valid,
        number_gpus=8,
        distributed_backend="FSDP",
        fsdp_sharding_strategy="FULL_SHARD",
        gradient_checkpointing=False,
        optim="adamw_torch_fused",
    )
    base = base.replace(gradient_accumulation_steps=1)
    fixed, acts, logits, _ = physics.memory_parts(base)
    grads = 4.0 * physics.trainable / base.number_gpus / _physics.GIB  # fp32 gradients, sharded
    assert acts + logits > grads
    accumulating = base.replace(gradient_accumulation_steps=2)
    assert physics.memory_parts(accumulating)[0] - fixed == pytest.approx(grads, rel=1e-9)
    ddp = _pick(valid, number_gpus=1, gradient_checkpointing=True).replace(
        number_gpus=2, distributed_backend="DDP", fsdp_sharding_strategy=None, fsdp_version=None
    )
    alone = ddp.replace(distributed_backend="NONE", number_gpus=1)
    full = 4.0 * physics.trainable / _physics.GIB
    assert physics.memory_parts(ddp)[0] - physics.memory_parts(alone)[0] == pytest.approx(full, rel=1e-9)


def test_the_allocated_peak_is_the_estimate_less_the_allocator_s_slack_and_the_context(job):
    """``allocated_gib``: what ``torch.cuda.max_memory_allocated`` measures, the tensors alone."""
    from explorer.search import _physics

    physics, valid = job
    c = _pick(valid, gradient_checkpointing=False)
    fixed, acts, logits, context = physics.memory_parts(c)
    slack = 1 + _physics.RESERVED_SLACK
    assert physics.slack == slack and context == _physics.CONTEXT_GIB
    assert physics.allocated_gib(c) == pytest.approx(fixed + (acts + logits) / slack, rel=1e-12)
    assert physics.memory_gib(c) - physics.allocated_gib(c) == pytest.approx(
        context + (acts + logits) * (1 - 1 / slack), rel=1e-9
    )


def test_throughput_directions(job):
    """On long-tailed entries packing beats padding to the longest entry (on more than one entry
    a device), which beats padding to max_length; offload, checkpointing and eager attention are
    slower."""
    physics, valid = job
    base = _fsdp_on_8(valid, attn_implementation="flash_attention_2", batch_size=32)
    assert base.per_device_batch_size == 4
    tput = physics.log_throughput
    assert tput(base.replace(padding="packed")) > tput(base.replace(padding="longest")) > tput(base)
    for slower in (
        base.replace(fsdp_cpu_offload=True),
        base.replace(gradient_checkpointing=True),
        base.replace(attn_implementation="eager"),
    ):
        assert tput(slower) < tput(base), slower


def test_parts_add_up_to_the_estimates(job):
    physics, valid = job
    some = valid[::997]
    parts = physics_parts(physics, some)
    ones_m, ones_t = np.ones(parts.memory.shape[1]), np.ones(parts.time.shape[1])
    assert np.allclose(parts.memory_gib(ones_m), [physics.memory_gib(c) for c in some], rtol=1e-9)
    assert np.allclose(parts.log_throughput(ones_t), [physics.log_throughput(c) for c in some], rtol=1e-9)


def _synthetic(seed: int = 0) -> PhysicsParts:
    rng = np.random.default_rng(seed)
    return PhysicsParts(
        memory=np.column_stack(
            [rng.uniform(1, 40, 300), rng.uniform(0, 60, 300), rng.uniform(0, 10, 300), np.ones(300)]
        ),
        data=rng.uniform(1e3, 1e5, 300),
        time=np.column_stack(
            [
                rng.uniform(0.1, 2, 300),
                rng.uniform(0, 1, 300),
                rng.uniform(0, 3, 300) * (rng.random(300) < 0.2),
                rng.uniform(0, 0.1, 300),
            ]
        ),
    )


def test_memory_scales_are_recovered_from_peaks():
    parts = _synthetic()
    truth = np.array([1.3, 0.2, 2.0, 1.0])  # activations 5x below the textbook, logits 2x above
    rows = list(range(0, 300, 15))
    peaks = [(r, float(parts.take([r]).memory_gib(truth)[0])) for r in rows]
    fitted = fit_memory_scales(parts, peaks, [], limit_gib=80.0)
    predicted = parts.memory_gib(fitted)
    actual = parts.memory_gib(truth)
    assert np.median(np.abs(np.log(predicted / actual))) < 0.05


def test_an_oom_raises_the_estimate_to_the_limit():
    parts = _synthetic(1)
    row = int(np.argmin(parts.memory_gib(np.ones(4))))
    before = float(parts.take([row]).memory_gib(np.ones(4))[0])
    limit = 3 * before
    after = parts.take([row]).memory_gib(fit_memory_scales(parts, [], [row], limit_gib=limit))[0]
    assert after > 0.8 * limit


def test_time_scales_are_recovered_from_throughputs():
    parts = _synthetic(2)
    truth = np.array([2.5, 0.5, 3.0, 1.0])
    rows = np.arange(0, 300, 10)
    measured = [(int(r), float(math.exp(parts.take([r]).log_throughput(truth)[0]))) for r in rows]
    fitted = fit_time_scales(parts, measured)
    error = np.abs(parts.log_throughput(fitted) - parts.log_throughput(truth))
    assert np.median(error) < 0.05


def test_nothing_measured_keeps_the_textbook():
    parts = _synthetic()
    assert np.allclose(fit_memory_scales(parts, [], [], limit_gib=None), 1.0)
    assert np.allclose(fit_time_scales(parts, []), 1.0)


@pytest.mark.parametrize(
    ("name", "best_gib", "median_ratio", "verdicts_differ"),
    [("granite-3.1-2b", 110.2, 1.326, 17), ("llama-3.1-8b", 83.0, 1.208, 12)],
)
def test_the_modelled_node_tables_peaks_against_the_physics(name, best_gib, median_ratio, verdicts_differ):
    """docs/benchmarks.md's figures for the earlier modelled tables (34 bytes of activations a
    token-layer-hidden unit): the physics' estimate of each table's best configuration, the median
    of its estimates over the table's peaks, and the fit verdicts on which they differ."""
    import csv

    loaded = load_study(ROOT / f"benchmarks/search_studies/{name}.yaml", check_model=False)
    r = loaded.spec.resources
    physics = JobPhysics(workload=loaded.spec.workload, resources=r)
    with open(ROOT / f"benchmarks/results/tables/model-{name}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))

    def key(n, b, ckpt, backend, version, strategy):
        fsdp = backend == "FSDP"
        return (int(n), int(b), str(ckpt), backend, str(version) if fsdp else "", strategy if fsdp else "")

    table = {
        key(
            d["number_gpus"],
            d["batch_size"],
            d["gradient_checkpointing"] == "True",
            d["distributed_backend"],
            d["fsdp_version"],
            d["fsdp_sharding_strategy"],
        ): d
        for d in rows
    }
    best = max(rows, key=lambda d: float(d["dataset_tokens_per_second_per_gpu"]))
    ratios, differ = [], 0
    for c in loaded.space.enumerate():
        if invalid_reason(c, r) is not None:
            continue
        row = table[
            key(
                c.number_gpus,
                c.batch_size,
                bool(c.gradient_checkpointing),
                c.distributed_backend,
                c.fsdp_version,
                c.fsdp_sharding_strategy,
            )
        ]
        estimate, peak = physics.memory_gib(c), float(row["peak_memory_gib"])
        ratios.append(estimate / peak)
        differ += (estimate <= physics.limit_gib) != (peak <= physics.limit_gib)
        if row is best:
            assert estimate == pytest.approx(best_gib, abs=0.05)
    assert len(ratios) == len(rows) == 190
    assert float(np.median(ratios)) == pytest.approx(median_ratio, abs=5e-4)
    assert differ == verdicts_differ


def test_the_h200_peak_falls_between_the_earlier_tables_model_and_the_physics():
    """docs/benchmarks.md's check of the earlier modelled tables against the one full fine-tune of
    granite-3.1-2b measured on a GPU (the H200 run: batch 16 x 2048, pure bf16, Liger, fused
    AdamW): the tables' memory model (``benchmarks/search_tables.py``, 34 bytes of activations a
    token-layer-hidden unit, no logits under Liger) puts it at 0.81x the allocated peak measured
    (0.92x with the bf16 logits, fp32 copy and gradient that granite keeps under Liger), the
    physics, which prices those logits and pure bf16's and Liger's activations as counted, at
    0.87x; it fits the card as measured."""
    import importlib
    import json
    import sys

    from explorer.trial_config import TrialConfig

    sys.path.insert(0, str(ROOT / "benchmarks"))
    tables = importlib.import_module("search_tables")
    run = ROOT / "benchmarks/results/gpu/2026-11-28"
    c = TrialConfig(**json.loads((run / "measure-configs.json").read_text())["best"])
    measured = json.loads((run / "measure-best.jsonl").read_text().splitlines()[0])["properties"]
    allocated = measured["peak_memory_allocated_gib"]
    m = tables.MODELS["granite-3.1-2b"]
    tokens = c.per_device_batch_size * c.model_max_length
    w = tables.Work(tokens=tokens, dense=tokens * c.model_max_length, flash=0.0, dataset=tokens)
    modelled = tables.knobs_memory_gib(m, c, w)
    with_logits = modelled + 10 * tokens * m.vocab / 2**30
    loaded = load_study(ROOT / "studies/granite-3.1-2b-full-1xh100-throughput.yaml", check_model=False)
    resources = loaded.spec.resources.model_copy(update={"gpu_model": "NVIDIA-H200"})
    job = JobPhysics(workload=loaded.spec.workload, resources=resources)
    physics = job.allocated_gib(c)
    assert allocated == pytest.approx(128.64, abs=0.005)
    assert modelled / allocated == pytest.approx(0.81, abs=0.005)
    assert with_logits / allocated == pytest.approx(0.92, abs=0.005)
    assert physics / allocated == pytest.approx(0.87, abs=0.005)
    assert job.memory_gib(c) <= job.limit_gib
    doc = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    said = f"the physics at {physics:.1f} ({physics / allocated:.2f}x, {job.memory_gib(c):.1f} GiB reserved"
    assert said in doc, said
    for page, said in (
        (
            "estimate.md",
            f"{job.memory_gib(c):.1f} GiB reserved and {physics:.1f} allocated ({physics / allocated:.2f}x)",
        ),
        (
            "gpu.md",
            f"{job.memory_gib(c):.1f} GiB reserved and {physics:.1f} allocated for this run ({physics / allocated:.2f}x)",
        ),
    ):
        assert said in " ".join((ROOT / "docs" / page).read_text().split()), (page, said)


def test_a_packed_batch_under_a_dense_kernel_is_priced_as_one_row(job):
    """A packed batch is one row of every entry (DataCollatorWithFlattening); eager and sdpa
    compute and mask that whole row's square (transformers' block-diagonal mask from the position
    ids), flash attention each entry's own: against the same batch padded to full length, sdpa's
    packed batch holds the row's boolean mask more and computes attention over the whole row;
    flash's packed batch needs the memory its padded one does at full length."""
    from explorer.flops import FlopModel

    physics, valid = job
    base = _fsdp_on_8(valid, attn_implementation="sdpa", per_device_batch_size=4)
    row = base.per_device_batch_size * base.model_max_length
    packed = base.replace(padding="packed")
    acts = physics.memory_parts(packed)[1] - physics.memory_parts(base)[1]
    assert acts == pytest.approx(row * row / 2**30 * physics.slack, rel=1e-9)
    flash = base.replace(attn_implementation="flash_attention_2")
    assert physics.memory_parts(flash.replace(padding="packed")) == pytest.approx(physics.memory_parts(flash))

    def per_token(seq_len: int) -> float:
        a = physics.arch
        return FlopModel(
            n_linear=a.linear,
            n_trainable_linear=a.linear,
            layers=a.layers,
            hidden=a.hidden,
            seq_len=seq_len,
            lora=False,
            checkpointing=0.0,
        ).hardware_flops_per_token

    # the packed row holds the b entries as they are (their mean length each), the padded batch b x s
    b, s = base.per_device_batch_size, base.model_max_length
    mean, _ = physics._clipped(b, s)

    def seconds(seq_len: int, tokens: float) -> float:
        return per_token(seq_len) * tokens / physics.efficiency(tokens)

    compute = physics.time_parts(packed)[1] / physics.time_parts(base)[1]
    assert compute == pytest.approx(seconds(int(b * mean), b * mean) / seconds(s, b * s), rel=1e-9)
    assert physics.log_throughput(packed) < physics.log_throughput(flash.replace(padding="packed"))


def test_a_packed_batch_is_priced_at_its_entries_real_length():
    """docs/estimate.md's figure: 16 sequences on one H100 of the throughput study's entries (a
    mean of 450 of 2,048 tokens), packed, priced as one row of the 16 entries as they are, against
    ``16 x model_max_length`` tokens before."""
    import math

    from explorer.trial_config import TrialConfig

    doc = " ".join((ROOT / "docs" / "estimate.md").read_text().split())
    loaded = load_study(ROOT / "studies/granite-3.1-2b-full-1xh100-throughput.yaml", check_model=False)
    job = JobPhysics(workload=loaded.spec.workload, resources=loaded.spec.resources)
    packed = TrialConfig(
        batch_size=16,
        number_gpus=1,
        gradient_checkpointing=False,
        model_max_length=2048,
        padding="packed",
        attn_implementation="flash_attention_2",
    )
    mean, _ = job._clipped(16, 2048)
    assert job._tokens(packed) == (16 * mean, 16 * mean)
    real = math.exp(job.log_throughput(packed))
    said = f"a mean of {mean:.0f} of 2,048 tokens, 16 sequences on one H100 are priced at {real:,.0f} dataset tokens/s"
    assert said in doc, said
