"""``explorer best``: selection within noise, accelerate config rendering, and the printed commands
really training (a real study on Ray, then torchrun and accelerate launch on the CPU)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from explorer.best import render_accelerate, select_best
from explorer.cli import main as cli_main
from explorer.study import open_study, optimize
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["LlamaDecoderLayer"]


def _cfg(**kw) -> TrialConfig:
    base = dict(batch_size=8, number_gpus=2, distributed_backend="DDP", gradient_checkpointing=False)
    return TrialConfig(model_max_length=64, **(base | kw))


def _render(config: TrialConfig, device_type: str = "cuda") -> dict:
    text = render_accelerate(config, device_type=device_type, torch_dtype="bfloat16", layer_classes=LAYERS)
    assert "${" not in text.replace("${...}", "")
    return yaml.safe_load(text)


def test_render_ddp_with_checkpointing_leaves_it_to_the_trainer():
    doc = _render(_cfg(gradient_checkpointing=True))
    assert doc["distributed_type"] == "MULTI_GPU" and doc["num_processes"] == 2
    assert doc["mixed_precision"] == "bf16" and doc["use_cpu"] is False
    assert "fsdp_config" not in doc


def test_render_one_process_and_cpu():
    assert _render(_cfg(number_gpus=1, distributed_backend="NONE"))["distributed_type"] == "NO"
    # one CPU process: the same use_cpu as training_arguments.json
    assert _render(_cfg(number_gpus=1, distributed_backend="NONE"), "cpu")["use_cpu"] is True
    assert _render(_cfg(number_gpus=1, distributed_backend="NONE"))["use_cpu"] is False
    doc = _render(
        _cfg(distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="FULL_SHARD"), "cpu"
    )
    assert doc["mixed_precision"] == "no"  # quoted in the YAML: a bare no would read as false
    assert doc["fsdp_config"]["fsdp_sync_module_states"] is False
    assert doc["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is False
    assert doc["use_cpu"] is False  # accelerate would start one process only


@pytest.mark.parametrize("version", [1, 2])
def test_render_fsdp_with_cpu_offload_on_one_gpu(version):
    """FSDP with CPU offload on one GPU renders accelerate's FSDP type for one process, offload on."""
    config = _cfg(
        number_gpus=1,
        distributed_backend="FSDP",
        fsdp_version=version,
        fsdp_sharding_strategy="FULL_SHARD",
        fsdp_cpu_offload=True,
    )
    doc = _render(config)
    assert doc["distributed_type"] == "FSDP" and doc["num_processes"] == 1
    assert doc["fsdp_config"]["fsdp_offload_params"] is True
    two = _render(_cfg(distributed_backend="FSDP", fsdp_version=version, fsdp_sharding_strategy="FULL_SHARD"))
    assert two["fsdp_config"]["fsdp_offload_params"] is False


@pytest.mark.parametrize(
    ("padding", "compile_", "dynamic"),
    [("packed", True, True), ("longest", True, True), ("max_length", True, False), ("packed", False, False)],
)
def test_a_compiled_config_with_changing_shapes_compiles_dynamic_under_accelerate_launch(
    padding, compile_, dynamic, tmp_path
):
    """The worker compiles with dynamic shapes where batches change shape; so does a run from
    best's accelerate.yaml: accelerate's own launch code reads it into the Trainer's environment."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    config = _cfg(number_gpus=1, distributed_backend="NONE", torch_compile=compile_, padding=padding)
    assert config.compiles_dynamic is dynamic
    path = tmp_path / "accelerate.yaml"
    path.write_text(
        render_accelerate(config, device_type="cpu", torch_dtype="bfloat16", layer_classes=LAYERS)
    )
    assert ("dynamo_config" in yaml.safe_load(path.read_text())) is dynamic
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    _, env = prepare_simple_launcher_cmd_env(args)
    assert env["ACCELERATE_DYNAMO_USE_DYNAMIC"] == str(dynamic)
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "NO"  # the Trainer's torch_compile does the compiling


def test_render_fsdp1_shard_grad_op():
    doc = _render(
        _cfg(
            distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="SHARD_GRAD_OP", number_gpus=4
        )
    )
    fsdp = doc["fsdp_config"]
    assert doc["distributed_type"] == "FSDP" and doc["num_processes"] == 4
    assert fsdp["fsdp_version"] == 1 and fsdp["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert fsdp["fsdp_activation_checkpointing"] is False and fsdp["fsdp_sync_module_states"] is True
    assert doc["mixed_precision"] == "bf16"


def test_render_fsdp2_full_shard_with_checkpointing():
    doc = _render(
        _cfg(
            distributed_backend="FSDP",
            fsdp_version=2,
            fsdp_sharding_strategy="FULL_SHARD",
            gradient_checkpointing=True,
        )
    )
    fsdp = doc["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_reshard_after_forward"] is True
    assert "fsdp_sharding_strategy" not in fsdp
    assert fsdp["fsdp_activation_checkpointing"] is True
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"


def _ok(value: float, rel_ci: float | None = None) -> optuna.trial.FrozenTrial:
    attrs = {"status": "ok", "step_time_rel_ci": rel_ci}
    return optuna.trial.create_trial(value=value, user_attrs=attrs)


@pytest.mark.parametrize(("rel_ci", "runners"), [(None, [99.0]), (0.01, [99.0]), (0.03, [99.0, 97.5])])
def test_runners_up_within_the_larger_of_2_percent_and_the_ci(rel_ci, runners):
    study = optuna.create_study(direction="maximize")
    for value in (97.5, 100.0, 99.0, 50.0):
        study.add_trial(_ok(value, rel_ci))
    oom = optuna.trial.create_trial(value=0.0, user_attrs={"status": "oom"})
    study.add_trial(oom)
    selection = select_best(study)
    assert selection is not None and selection.best.value == 100.0
    assert [t.value for t in selection.runners_up] == runners


def test_no_feasible_trial_is_one_line_exit_2_nothing_written(write_study, tmp_path, capsys):
    path = write_study({"storage": f"sqlite:///{tmp_path}/s.db"})
    study = open_study(load_study(path), create=True)
    study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs={"status": "oom"}))
    out = tmp_path / "best-out"
    assert cli_main(["best", str(path), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "no feasible trial in study 'test'" in captured.err
    assert not out.exists()


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False
    )


@pytest.mark.slow  # a real multi-trial study: in `make test-slow` (CI runs it after `make test`)
def test_best_of_a_real_study_and_its_printed_commands_train(write_study, tmp_path, capsys):
    space = {
        "batch_size": {"values": [4]},
        "number_gpus": 2,
        "distributed_backend": {"choices": ["DDP", "FSDP"]},
        "fsdp_version": {"choices": [1]},
        "fsdp_sharding_strategy": {"choices": ["SHARD_GRAD_OP"]},
        "gradient_checkpointing": {"choices": [False]},
    }
    path = write_study(
        {"storage": f"sqlite:///{tmp_path}/s.db", "n_trials": 2, "search_space": {"parameters": space}}
    )
    loaded = load_study(path)
    result = optimize(loaded, printer=lambda _: None)
    assert result.statuses.get("ok") == 2

    assert cli_main(["best", str(path), "--steps", "3"]) == 0
    printed = capsys.readouterr().out
    out = loaded.output_dir / "best"
    for name in ("accelerate.yaml", "training_arguments.json", "job.json", "launch.sh"):
        assert str(out / name) in printed
    assert "within noise" in printed and "MFU" in printed
    doc = yaml.safe_load((out / "accelerate.yaml").read_text())
    assert doc["num_processes"] == 2 and doc["distributed_type"] in ("MULTI_GPU", "FSDP")
    kwargs = json.loads((out / "training_arguments.json").read_text())
    assert kwargs["per_device_train_batch_size"] == 2 and kwargs["use_cpu"] is True
    assert (doc["distributed_type"] == "FSDP") == bool(kwargs.get("fsdp"))

    torchrun = next(line.strip() for line in printed.splitlines() if line.strip().startswith("torchrun "))
    assert "--nproc_per_node 2" in torchrun
    done = _run(torchrun, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 4 steps (1 warmup, 3 measured) on 2 process(es)" in done.stdout
    measured = json.loads((out / "run" / "result.json").read_text())
    assert measured["outcome"] == "ok" and measured["properties"]["measured_steps"] == 3
    wrapper = measured["extra"]["wrapper"]
    assert wrapper.startswith(
        "FullyShardedDataParallel" if doc["distributed_type"] == "FSDP" else "Distributed"
    )

    accelerate = next(
        line.strip() for line in printed.splitlines() if line.strip().startswith("accelerate launch ")
    )
    done = _run(accelerate, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 4 steps" in done.stdout
