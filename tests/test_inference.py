"""OOM inference: dominance on the memory axes, and its use in a real study (sqlite, replayed table)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from explorer.search import fits_by_dominance, inferred_oom, memory_dominates
from explorer.study import (
    config_of,
    counted_trials,
    open_study,
    optimize,
    status_of,
)
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.builders import config

BASE = dict(
    batch_size=8,
    number_gpus=2,
    distributed_backend="FSDP",
    fsdp_version=1,
    fsdp_sharding_strategy="SHARD_GRAD_OP",
    gradient_checkpointing=True,
    model_max_length=1024,
)


def _c(**kw) -> TrialConfig:
    return config(BASE, **kw)


@pytest.mark.parametrize(
    ("change", "hungrier"),
    [
        (dict(batch_size=16), True),  # larger per-device batch
        (dict(batch_size=4), False),
        (dict(model_max_length=2048), True),
        (dict(gradient_checkpointing=False), True),
        (dict(fsdp_sharding_strategy="NO_SHARD"), True),  # less sharding
        (dict(fsdp_sharding_strategy="FULL_SHARD"), False),  # more sharding
        (dict(number_gpus=1, batch_size=4), True),  # fewer GPUs under sharding, same per-device batch
        (dict(number_gpus=4, batch_size=16), False),
        (dict(fsdp_version=2), False),  # another implementation: no claim
        (dict(optim="adafactor"), False),
    ],
)
def test_dominance_along_each_axis(change, hungrier):
    base = _c()
    assert memory_dominates(_c(**change), base) is hungrier
    assert memory_dominates(base, base)


def test_replicated_models_ignore_the_gpu_count_and_hybrid_only_matches_itself():
    ddp = dict(distributed_backend="DDP", fsdp_version=None, fsdp_sharding_strategy=None)
    assert memory_dominates(_c(number_gpus=4, batch_size=16, **ddp), _c(**ddp))  # same per-device batch
    hybrid = _c(fsdp_sharding_strategy="HYBRID_SHARD")
    assert memory_dominates(hybrid, hybrid)
    assert not memory_dominates(_c(fsdp_sharding_strategy="NO_SHARD"), hybrid)


def test_inferred_and_fitting_cite_the_proving_trial():
    oom, fit = _c(batch_size=16), _c(batch_size=4)
    assert inferred_oom(_c(batch_size=32), [(3, _c(batch_size=64)), (7, oom)]) == 7
    assert inferred_oom(_c(batch_size=8), [(7, oom)]) is None
    assert fits_by_dominance(_c(batch_size=2), [(5, fit)]) == 5


def _table(path: Path) -> Path:
    """A recorded 1-GPU table: batches above 32 without checkpointing (above 64 with) ran out."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model_name", "number_gpus", "batch_size", "gradient_checkpointing", "dataset_tokens_per_second_per_gpu", "is_valid"])  # fmt: skip
        for bs in (4, 8, 16, 32, 64, 128, 256):
            for ckpt in (False, True):
                fits = bs <= (64 if ckpt else 32)
                w.writerow(
                    ["tiny-llama", 1, bs, ckpt, (100 + bs) * (0.8 if ckpt else 1.0) if fits else 0, int(fits)]
                )
    return path


@pytest.mark.parametrize("infer", [True, False])
def test_a_study_infers_ooms_instead_of_running_them(infer, write_study, tmp_path):
    path = write_study(
        {
            "storage": f"sqlite:///{tmp_path}/s.db",
            "n_trials": 10,
            "infer_oom": infer,
            "sampler": {"kind": "random", "seed": 0},
            "launcher": {"kind": "replay", "table": str(_table(tmp_path / "t.csv"))},
            "search_space": {
                "parameters": {
                    "batch_size": {"values": [4, 8, 16, 32, 64, 128, 256]},
                    "number_gpus": 1,
                    "gradient_checkpointing": {"choices": [False, True]},
                }
            },
        }
    )
    loaded = load_study(path)
    first = open_study(loaded, create=True)
    for bs in (64, 128, 256):  # the smallest OOM first, then two configurations that dominate it
        config = TrialConfig(
            batch_size=bs,
            number_gpus=1,
            distributed_backend="NONE",
            gradient_checkpointing=False,
            model_max_length=64,
        )
        first.enqueue_trial(loaded.space.params_for(config))
    optimize(loaded, printer=lambda _: None)
    study = open_study(loaded, create=False)
    trials = study.get_trials()
    inferred = [t for t in trials if "inferred_from" in t.user_attrs]
    assert len(counted_trials(study)) == 10
    if not infer:
        assert inferred == []
        return
    assert {config_of(t).batch_size for t in inferred if not config_of(t).gradient_checkpointing} >= {
        128,
        256,
    }
    by_number = {t.number: t for t in trials}
    for t in inferred:
        proof = by_number[t.user_attrs["inferred_from"]]
        assert status_of(t) == "oom" and status_of(proof) == "oom" and "inferred_from" not in proof.user_attrs
        assert memory_dominates(config_of(t), config_of(proof))
        assert t.user_attrs["wall_seconds"] == 0.0 and t.system_attrs["constraints"] == [1.0]
    # the table agrees: every inferred configuration really is invalid there
    for t in inferred:
        c = config_of(t)
        assert c.batch_size > (64 if c.gradient_checkpointing else 32)


def test_an_adamw_torch_oom_says_nothing_of_the_fused_kernel():
    """adamw_torch (foreach on CUDA) needs about one more copy of the parameters at its step than
    adamw_torch_fused (PyTorch's torch.optim docs): a fused OOM implies adamw_torch's, not back."""
    plain, fused = _c(optim="adamw_torch"), _c(optim="adamw_torch_fused")
    assert memory_dominates(plain, fused) and not memory_dominates(fused, plain)
    assert inferred_oom(fused, [(1, plain)]) is None
    assert inferred_oom(plain, [(2, fused)]) == 2
    for light in ("adamw_bnb_8bit", "adafactor"):  # both still below either AdamW
        assert memory_dominates(fused, _c(optim=light)) and memory_dominates(plain, _c(optim=light))


@pytest.mark.parametrize(
    ("attn", "packed_at_most_max_length"),
    [("sdpa", False), ("eager", False), ("flash_attention_2", True), ("flex_attention", True)],
)
def test_packed_is_below_max_length_only_where_attention_stays_within_entries(
    attn, packed_at_most_max_length
):
    """sdpa and eager build a block-diagonal mask over the whole packed row (length x length);
    flash (varlen through the position ids) and flex (block-sparse) attend within each entry."""
    packed, padded = (
        _c(padding="packed", attn_implementation=attn),
        _c(padding="max_length", attn_implementation=attn),
    )
    assert memory_dominates(padded, packed) is packed_at_most_max_length
    assert inferred_oom(packed, [(1, padded)]) is None  # never: packed is not above max_length
    assert (inferred_oom(padded, [(1, packed)]) == 1) is packed_at_most_max_length
