"""The winner carries to the user's own run: ``explorer best``'s files (training_arguments.json,
accelerate.yaml, sft_config.json, run_settings.json and the commands it writes) reproduce the
configuration in a plain ``Trainer`` under ``torchrun``, the same under ``accelerate launch
--config_file accelerate.yaml``, and TRL's ``SFTTrainer`` with ``SFTConfig(**sft_config.json)``.

The launches are real (2 processes, gloo, on the CPU) and run ``explorer.user_train``, a stock
script that reads only the written files (and the model); each rank writes what really trained
(the wrapper and its resharding, the layers recomputed in the backward, the batch, the
optimizer's class). On the CPU, FSDP runs through explorer's CPU shim
(``explorer.settings.FsdpOnCpu``: accelerate ignores FSDP there), which the facts name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from explorer.best import write_config
from explorer.settings import RunSettings, SettingsError, run_settings
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from tests.conftest import TINY_ARCH

REPO = Path(__file__).resolve().parents[1]
FOUR_LAYERS = {"workload": {"model": {"architecture": {**TINY_ARCH, "num_hidden_layers": 4}}}}
BASE = dict(batch_size=4, number_gpus=2, gradient_checkpointing=False, model_max_length=64)
WINNERS: dict[str, dict[str, Any]] = {
    "fsdp2_full_shard": dict(distributed_backend="FSDP", fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD"),
    "fsdp1_shard_grad_op": dict(
        distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="SHARD_GRAD_OP"
    ),
    "ddp_half_checkpointed": dict(
        distributed_backend="DDP", gradient_checkpointing=True, checkpoint_fraction=0.5, optim="adafactor"
    ),
    "packed_liger": dict(distributed_backend="DDP", padding="packed", liger_kernel=True),
}
LAUNCHES = ("torchrun", "accelerate", "sft")


def _write(write_study, tmp_path: Path, name: str) -> Path:
    """``explorer best``'s files for winner ``name`` (a study on the CPU), in ``tmp_path/best``."""
    loaded = load_study(write_study(FOUR_LAYERS))
    config = TrialConfig(**(BASE | WINNERS[name]))
    out = tmp_path / "best"
    write_config(loaded, config, out, steps=3, trial_number=0, device_type="cpu", title=f"winner {name}")
    return out


def _launch(best: Path, which: str, out: Path) -> subprocess.CompletedProcess[str]:
    """The user command ``explorer best`` wrote for ``which``, as written (its environment
    included), with ``--out``."""
    command = json.loads((best / "run_settings.json").read_text())["commands"][which]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_", "ACCELERATE_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        ["bash", "-c", f"{command} --out {out}"],
        cwd=best.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


def _facts(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"facts-rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture
def one_rank(monkeypatch):
    """A world of one gloo rank (as torchrun would start it), for TrainingArguments that name a
    process group backend; torn down after the test (accelerate's shared state too)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, PartialState

    if dist.is_initialized():
        dist.destroy_process_group()
    AcceleratorState._reset_state(True)
    PartialState._reset_state()


# ---- the mapping itself (fast) ----


def test_each_file_carries_the_winner(write_study, tmp_path):
    """What each written file says, winner by winner: sharding, resharding, the environment FSDP1
    needs on the torchrun line, checkpointing (every layer only when the fraction is 1), packing
    (TRL's padding-free), Liger, and the call that applies what no Hugging Face setting holds."""
    files = {name: _write(write_study, tmp_path / name, name) for name in WINNERS}

    def read(name: str, file: str) -> Any:
        text = (files[name] / file).read_text()
        return yaml.safe_load(text) if file.endswith(".yaml") else json.loads(text)

    args = read("fsdp2_full_shard", "training_arguments.json")
    assert args["fsdp"] is True and args["fsdp_config"]["version"] == 2
    assert args["fsdp_config"]["reshard_after_forward"] is True
    assert read("fsdp2_full_shard", "accelerate.yaml")["fsdp_config"]["fsdp_reshard_after_forward"] is True

    run = read("fsdp1_shard_grad_op", "run_settings.json")
    assert run["environment"] == {"FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"}
    assert run["commands"]["torchrun"].startswith("FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP torchrun ")
    assert run["commands"]["sft"].startswith("FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP torchrun ")
    assert (
        read("fsdp1_shard_grad_op", "accelerate.yaml")["fsdp_config"]["fsdp_sharding_strategy"]
        == "SHARD_GRAD_OP"
    )

    half = "ddp_half_checkpointed"
    assert read(half, "training_arguments.json")["activation_checkpointing"] is False  # not every layer
    assert read(half, "training_arguments.json")["optim"] == "adafactor"
    assert read(half, "run_settings.json")["checkpoint_fraction"] == 0.5
    assert "prepare_model" in read(half, "run_settings.json")["how"]["model"]

    sft = read("packed_liger", "sft_config.json")
    assert sft["padding_free"] is True and sft["packing"] is False and sft["use_liger_kernel"] is True
    assert read("packed_liger", "training_arguments.json")["use_liger_kernel"] is True
    assert read("packed_liger", "run_settings.json")["padding"] == "packed"
    assert read("fsdp2_full_shard", "sft_config.json")["pad_to_multiple_of"] == 64  # max_length padding


def test_a_study_cannot_pass_through_what_the_mapping_decides(write_study, tmp_path):
    """Every TrainingArguments field the mapping writes is explorer's (passthrough refuses it in a
    study's workload.training_arguments), but the benchmark-only ones a study may override."""
    from explorer.passthrough import reserved_reason
    from explorer.settings import BENCHMARK_ONLY

    for name in WINNERS:
        written = json.loads(
            (_write(write_study, tmp_path / name, name) / "training_arguments.json").read_text()
        )
        assert [k for k in written if reserved_reason(k) is None and k not in BENCHMARK_ONLY] == [], name


def test_fsdp_checkpointing_a_fraction_of_layers_is_not_fsdps_every_layer():
    """accelerate.yaml and fsdp_config turn FSDP's checkpointing (every layer) on only for a
    fraction of 1; a fraction below goes to run_settings.json."""
    from explorer.settings import render_accelerate

    for fraction, every in ((1.0, True), (0.5, False)):
        config = TrialConfig(
            **(BASE | {"gradient_checkpointing": True, "checkpoint_fraction": fraction}),
            distributed_backend="FSDP",
            fsdp_version=2,
            fsdp_sharding_strategy="FULL_SHARD",
        )
        doc = yaml.safe_load(
            render_accelerate(
                config, device_type="cuda", torch_dtype="bfloat16", layer_classes=["LlamaDecoderLayer"]
            )
        )
        assert doc["fsdp_config"]["fsdp_activation_checkpointing"] is every
        assert run_settings(config).checkpoint_fraction == (None if every else 0.5)


def test_the_worker_trains_the_arguments_best_writes(write_study, tmp_path, monkeypatch, one_rank):
    """One mapping: the worker's TrainingArguments are those of best's files (chosen and
    benchmark-only together), but Liger, which the worker patches itself to record what changed;
    the worker sets the environment run_settings.json names."""
    from dataclasses import fields

    import torch
    from transformers import TrainingArguments

    from explorer.job import TrialJob
    from explorer.worker._train import training_arguments

    def values(args: Any) -> dict[str, Any]:
        return {f.name: getattr(args, f.name) for f in fields(args)}

    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "unset")  # restored after the test
    for name in WINNERS:
        monkeypatch.delenv("FSDP_SHARDING_STRATEGY")
        best = _write(write_study, tmp_path / name, name)
        written = {
            **json.loads((best / "benchmark_arguments.json").read_text()),
            **json.loads((best / "training_arguments.json").read_text()),
        }
        job = TrialJob.from_json((best / "job.json").read_text())
        layers = ["LlamaDecoderLayer"] if job.config.distributed_backend == "FSDP" else None
        worker = training_arguments(
            job, device=torch.device("cpu"), output_dir=str(tmp_path), layer_classes=layers
        )
        user = TrainingArguments(output_dir=str(tmp_path), max_steps=worker.max_steps, **written)
        assert {**values(worker), "use_liger_kernel": user.use_liger_kernel} == values(user), name
        assert user.use_liger_kernel is bool(job.config.liger_kernel)
        environment = RunSettings.load(best).environment
        assert {k: os.environ[k] for k in environment} == environment
        assert ("FSDP_SHARDING_STRATEGY" in os.environ) is (name == "fsdp1_shard_grad_op")
        monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "unset")


def test_fsdp1s_strategy_needs_the_written_environment(write_study, tmp_path, monkeypatch, one_rank):
    """accelerate's FSDP1 plugin, built from the written TrainingArguments as the Trainer builds
    it: SHARD_GRAD_OP with the environment run_settings.json (and the torchrun line) gives, and
    FULL_SHARD without it: the trap the written command avoids."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    best = _write(write_study, tmp_path, "fsdp1_shard_grad_op")
    written = json.loads((best / "training_arguments.json").read_text())
    args = TrainingArguments(output_dir=str(tmp_path), **written)
    monkeypatch.delenv("FSDP_SHARDING_STRATEGY", raising=False)
    assert FullyShardedDataParallelPlugin(**args.fsdp_plugin_args).sharding_strategy.name == "FULL_SHARD"
    for key, value in RunSettings.load(best).environment.items():
        monkeypatch.setenv(key, value)
    assert FullyShardedDataParallelPlugin(**args.fsdp_plugin_args).sharding_strategy.name == "SHARD_GRAD_OP"


def _counted(forward: Any, calls: list[int], i: int) -> Any:
    """``forward``, counting its calls in ``calls[i]`` (module hooks do not see a recompute)."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[i] += 1
        return forward(*args, **kwargs)

    return counted


def test_the_public_calls_apply_what_no_setting_holds():
    """prepare_model checkpoints half of 4 layers (1 and 3: recomputed in the backward, their
    forward runs twice); data_collator packs unpadded entries as the worker packs padded ones."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from explorer.settings import collator_for, pad_item

    arch = {**TINY_ARCH, "num_hidden_layers": 4}
    config = TrialConfig(**(BASE | WINNERS["ddp_half_checkpointed"] | {"padding": "packed"}))
    run = run_settings(config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch.pop("model_type"), **arch))
    assert run.prepare_model(model)["checkpointed_layers"] == [1, 3]
    calls = [0] * 4  # each layer's MLP runs again when the backward recomputes the layer
    for i, layer in enumerate(model.model.layers):
        layer.mlp.forward = _counted(layer.mlp.forward, calls, i)
    model.train()
    entries = [torch.arange(2, 2 + n) for n in (5, 9, 3)]
    batch = run.data_collator()([{"input_ids": e.tolist()} for e in entries])
    model(**batch).loss.backward()
    assert calls == [1, 2, 1, 2]
    worker = collator_for("packed")([pad_item(e, 64) for e in entries])
    assert batch.keys() == worker.keys() and all(torch.equal(batch[k], worker[k]) for k in batch)
    assert batch["input_ids"].shape == (1, 17)


def test_a_lora_winner_carries_its_adapters(write_study, tmp_path):
    """LoRA has no TrainingArguments field: run_settings.json names peft's LoraConfig, and the
    user's model gets the adapters the worker's had (the same trainable parameters)."""
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from explorer.spec import MethodSpec, ModelSpec
    from explorer.worker._model import build_model, load_config

    method = {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    loaded = load_study(write_study({"workload": {"method": method}}))
    best = tmp_path / "best"
    config = TrialConfig(**(BASE | WINNERS["ddp_half_checkpointed"] | {"lora_r": 8}))
    write_config(loaded, config, best, steps=3, trial_number=0, device_type="cpu", title="lora")
    run = RunSettings.load(best)
    assert run.lora == {
        "r": 8,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj", "down_proj"],
        "task_type": "CAUSAL_LM",
    }
    spec = ModelSpec(name="tiny", architecture=TINY_ARCH)
    worker = build_model(spec, None, load_config(spec, None), lora_r=8, method=MethodSpec(**method))
    arch = dict(TINY_ARCH)
    user = get_peft_model(
        AutoModelForCausalLM.from_config(AutoConfig.for_model(arch.pop("model_type"), **arch)),
        run.peft_config(),
    )

    def trainable(model: Any) -> dict[str, tuple[int, ...]]:
        return {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}

    assert (
        trainable(user) == trainable(worker)
        and len(trainable(user)) == 2 * 3 * TINY_ARCH["num_hidden_layers"]
    )


def test_a_bad_run_settings_file_is_one_line_exit_2(tmp_path, capsys):
    from explorer.user_train import main

    (tmp_path / "run_settings.json").write_text(json.dumps({"model_max_length": 64, "padding": "rows"}))
    with pytest.raises(SettingsError, match="field checkpoint_fraction: missing"):
        RunSettings.load(tmp_path)
    assert main(["--settings", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run_settings.json" in err and not list(tmp_path.glob("user-run"))


# ---- the three user launches (slow: two real processes each) ----


@pytest.mark.slow
@pytest.mark.parametrize("which", LAUNCHES)
def test_fsdp2_full_shard_winner(write_study, tmp_path, which):
    best = _write(write_study, tmp_path, "fsdp2_full_shard")
    done = _launch(best, which, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    for facts in _facts(tmp_path / "run"):
        assert facts["wrapper"] == "FSDPModule" and facts["reshard_after_forward"] is True
        assert facts["cpu_fsdp_shim"] is True  # the CPU shim, named: accelerate ignores FSDP on the CPU
        assert facts["steps"] == 3 and facts["world_size"] == 2
        assert facts["optimizer"] == "torch.optim.adamw.AdamW"
        assert facts["checkpointed_layers"] == [] and facts["packed"] is False
        assert facts["batch"]["shape"] == [2, 64]  # max_length padding: 4 / 2 ranks, 64 tokens


@pytest.mark.slow
@pytest.mark.parametrize("which", LAUNCHES)
def test_fsdp1_shard_grad_op_winner(write_study, tmp_path, which):
    best = _write(write_study, tmp_path, "fsdp1_shard_grad_op")
    done = _launch(best, which, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    for facts in _facts(tmp_path / "run"):
        assert (
            facts["wrapper"] == "FullyShardedDataParallel" and facts["sharding_strategy"] == "SHARD_GRAD_OP"
        )
        assert facts["steps"] == 3 and facts["cpu_fsdp_shim"] is True
        # the launch itself set FSDP1's strategy (the written torchrun line, or accelerate from
        # accelerate.yaml), not prepare_model's fallback
        assert (
            facts["fsdp_sharding_strategy_env"] == "SHARD_GRAD_OP" and facts["prepared"]["environment"] == {}
        )


@pytest.mark.slow
@pytest.mark.parametrize("which", LAUNCHES)
def test_ddp_winner_with_half_the_layers_checkpointed(write_study, tmp_path, which):
    best = _write(write_study, tmp_path, "ddp_half_checkpointed")
    done = _launch(best, which, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    for facts in _facts(tmp_path / "run"):
        assert facts["wrapper"] == "DistributedDataParallel" and facts["cpu_fsdp_shim"] is False
        assert facts["layers"] == 4 and facts["checkpointed_layers"] == [1, 3]  # recomputed in the backward
        assert facts["optimizer"] == "transformers.optimization.Adafactor"
        assert facts["steps"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("which", LAUNCHES)
def test_packed_liger_winner_packs_and_fails_honestly_on_the_cpu(write_study, tmp_path, which):
    """Liger Kernel's kernels are Triton's, for GPUs: each CPU launch stops with the error that says
    why (never a silent run without Liger): the Trainer's own where liger_kernel is not installed
    (here), triton's "0 active drivers" at the first forward where it is (liger-kernel 0.8.5 and
    triton 3.9.0 install on this machine; their kernels cannot run). The batch the Trainer's
    dataloader makes is packed: one row of the rank's 2 entries, with position ids."""
    best = _write(write_study, tmp_path, "packed_liger")
    done = _launch(best, which, tmp_path / "run")
    try:
        import liger_kernel  # noqa: F401

        reason = "active drivers"
    except ImportError:
        reason = "liger-kernel"
    assert done.returncode != 0 and reason in done.stderr
    for facts in _facts(tmp_path / "run"):
        assert reason in facts["error"] and facts["use_liger_kernel"] is True
        assert facts["packed"] is True and "position_ids" in facts["batch"]["keys"]
        assert facts["batch"]["shape"][0] == 1 and facts["batch"]["entries"] == 2
