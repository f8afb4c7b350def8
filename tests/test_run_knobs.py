"""The knobs of issue 15 reach the run for real: attention kernel, precision, optimizer, selective
activation checkpointing on every path, and what each value needs of the device (real HF Trainer,
real torchrun, gloo on the CPU). CUDA-only values are refused here; their runs are in
tests/test_gpu.py."""

from __future__ import annotations

import pytest

from explorer.knobs import Axis, knob
from explorer.launch import run_trial
from explorer.measurement import Outcome
from explorer.trial_config import TrialConfig
from explorer.worker._apply import UnmetNeed, checkpointed_layers, unmet_needs


def test_tied_levels_compare_both_ways_and_step_down_to_the_level_below():
    axis = Axis("ordered", ("adafactor", "adamw_bnb_8bit", ("adamw_torch", "adamw_torch_fused")))
    assert axis.at_least("adamw_torch", "adamw_torch_fused") and axis.at_least(
        "adamw_torch_fused", "adamw_torch"
    )
    assert axis.at_least("adamw_torch_fused", "adafactor") and not axis.at_least("adafactor", "adamw_torch")
    assert not axis.at_least("sgd", "adafactor") and axis.at_least("sgd", "sgd")
    assert axis.step_down("adamw_torch_fused") == "adamw_bnb_8bit" and axis.step_down("adafactor") is None
    # a tied level below a value steps down to that level's first value
    assert Axis("ordered", (("flash_attention_2", "sdpa"), "eager")).step_down("eager") == "flash_attention_2"


def test_the_optimizers_memory_order_puts_fused_adamw_below_plain():
    from types import SimpleNamespace

    ddp = SimpleNamespace(distributed_backend="DDP", fsdp_version=None)
    fsdp1 = SimpleNamespace(distributed_backend="FSDP", fsdp_version=1)
    # the same two states, but plain AdamW is foreach on CUDA: its step's tensorlist
    # intermediates need about one more copy of the parameters (torch.optim docs); not tied
    for context in (ddp, fsdp1):
        memory = knob("optim").memory.axis_for(context)
        assert isinstance(memory, Axis)
        assert memory.at_least("adamw_torch", "adamw_torch_fused")
        assert not memory.at_least("adamw_torch_fused", "adamw_torch")
    plain = knob("optim").memory.axis_for(ddp)
    assert plain.at_least("adamw_bnb_8bit", "adafactor") and not plain.at_least("adafactor", "adamw_bnb_8bit")
    # under FSDP1 Adafactor sees flattened 1-D shards and keeps full second moments: above 8-bit
    flat = knob("optim").memory.axis_for(fsdp1)
    assert flat.at_least("adafactor", "adamw_bnb_8bit") and not flat.at_least("adamw_bnb_8bit", "adafactor")


@pytest.mark.parametrize(
    ("n", "fraction", "layers"),
    [
        (8, 1.0, list(range(8))),
        (8, 0.5, [1, 3, 5, 7]),
        (8, 0.25, [3, 7]),
        (2, 0.5, [1]),
        (4, 0.3, [3]),
        (3, 0.25, []),
    ],
)
def test_checkpointed_layers_are_spread_evenly(n, fraction, layers):
    assert checkpointed_layers(n, fraction) == layers


def _config(**values) -> TrialConfig:
    return TrialConfig(
        batch_size=4, number_gpus=1, gradient_checkpointing=False, model_max_length=64, **values
    )


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (
            {"attn_implementation": "flash_attention_2"},
            "attn_implementation: 'flash_attention_2' needs a CUDA",
        ),
        ({"liger_kernel": True}, "liger_kernel: True needs a CUDA device"),
        ({"optim": "adamw_bnb_8bit"}, "optim: 'adamw_bnb_8bit' needs a CUDA device"),
    ],
)
def test_a_rank_on_the_cpu_refuses_a_cuda_only_value(values, words):
    with pytest.raises(UnmetNeed, match=words):
        unmet_needs(_config(**values), device_type="cpu", model_type="llama")


def test_a_rank_names_a_package_it_cannot_import():
    """flash_attn is not installed here: on a CUDA rank the check names the package."""
    with pytest.raises(UnmetNeed, match="needs the Python package 'flash_attn'"):
        unmet_needs(_config(attn_implementation="flash_attention_2"), device_type="cuda", model_type="llama")
    with pytest.raises(UnmetNeed, match="does not support model_type 'gpt2'"):
        unmet_needs(_config(liger_kernel=True), device_type="cuda", model_type="gpt2")
    unmet_needs(
        _config(attn_implementation="eager", optim="adafactor"), device_type="cpu", model_type="llama"
    )


def test_attention_precision_and_optimizer_reach_the_model(make_job, tmp_path):
    """eager attention, pure bf16 weights and the fused AdamW, as the trained model has them."""
    job = make_job(
        batch_size=4,
        number_gpus=1,
        attn_implementation="eager",
        precision="pure_bf16",
        optim="adamw_torch_fused",
    )
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, warm_start=True)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["attention_in_model"] == "eager"
    assert m.extra["weights_dtype"] == "bfloat16"
    assert m.extra["liger"] == "off"
    assert m.properties is not None and m.properties.dataset_tokens_per_second > 0


def test_adafactor_and_the_default_kernels_train(make_job, tmp_path):
    job = make_job(batch_size=4, number_gpus=1, optim="adafactor")
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, warm_start=True)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["attention_in_model"] == "sdpa" and m.extra["weights_dtype"] == "float32"


PATHS = {
    "single": dict(number_gpus=1),
    "DDP": dict(number_gpus=2, distributed_backend="DDP"),
    "FSDP1": dict(
        number_gpus=2, distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="FULL_SHARD"
    ),
    "FSDP2": dict(
        number_gpus=2, distributed_backend="FSDP", fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD"
    ),
}


@pytest.mark.parametrize(
    "path", [pytest.param(p, marks=pytest.mark.slow) if p in ("DDP", "FSDP1") else p for p in PATHS]
)
def test_selective_checkpointing_checkpoints_half_the_layers_on_every_path(path, make_job, tmp_path):
    """The tiny Llama has 2 decoder layers: a fraction of 0.5 checkpoints one of them."""
    job = make_job(batch_size=4, gradient_checkpointing=True, checkpoint_fraction=0.5, **PATHS[path])
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, warm_start=True)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["checkpointed_layers"] == [1, 2]
    assert m.extra["checkpointing"] == "on"
    p = m.properties
    assert p is not None
    # half the layers recompute their forward: the hardware FLOPs lie between none and all
    assert p.mfu < p.hfu


NEW_KNOBS_SPACE = {
    "parameters": {
        "batch_size": {"values": [4, 8]},
        "number_gpus": 2,
        "distributed_backend": "FSDP",
        "fsdp_version": 2,
        "fsdp_sharding_strategy": "FULL_SHARD",
        "fsdp_cpu_offload": False,
        "gradient_checkpointing": True,
        "checkpoint_fraction": {"choices": [0.5, 1.0]},
        "padding": {"choices": ["max_length", "packed"]},
        "attn_implementation": {"choices": ["eager", "sdpa"]},
        "precision": {"choices": ["mixed", "pure_bf16"]},
        "optim": {"choices": ["adamw_torch", "adamw_torch_fused"]},  # adafactor: not under FSDP2
        "liger_kernel": False,
    }
}


def test_a_study_searches_the_new_knobs(write_study, tmp_path):
    """validate lists every new knob; optimize runs real trials over them and stores each
    trial's values (FSDP2 on two CPU processes; the CUDA-only values are fixed off)."""
    import optuna

    from tests.builders import run_cli

    study = write_study({"n_trials": 3, "search_space": NEW_KNOBS_SPACE})
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    proc = run_cli("validate", str(study), timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in NEW_KNOBS_SPACE["parameters"]:
        assert name in proc.stdout, name
    proc = run_cli("optimize", str(study), "--storage", storage, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    trials = optuna.load_study(study_name="test", storage=storage).get_trials(deepcopy=False)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3
    for t in done:
        assert {"attn_implementation", "precision", "optim", "checkpoint_fraction", "padding"} <= set(
            t.params
        )
        assert t.user_attrs["liger_kernel"] is False and t.user_attrs["fsdp_cpu_offload"] is False
        assert t.user_attrs["attention_in_model"] == t.params["attn_implementation"]
        dtype = "bfloat16" if t.params["precision"] == "pure_bf16" else "float32"
        assert t.user_attrs["weights_dtype"] == dtype
