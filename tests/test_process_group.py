"""The trial's process group (issue 27, items 1 and 2): FSDP's CPU offload gets a CPU backend
beside NCCL, and FSDP on one GPU really wraps the model (a world of one), and says so."""

from __future__ import annotations

import sys

import pytest
from torch.distributed.distributed_c10d import Backend, BackendConfig

from explorer.launch import run_trial, trial_command
from explorer.launch._command import rank_environments
from explorer.measurement import Outcome
from explorer.worker._train import process_group_backend, training_kwargs

FSDP2 = dict(distributed_backend="FSDP", fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD")


def _devices(backend: str) -> dict[str, str]:
    """torch's own reading of a backend string: which backend serves each device type."""
    return dict(BackendConfig(Backend(backend)).get_device_backend_map())


@pytest.mark.parametrize("gpus", [1, 2])
def test_fsdp_offload_process_group_has_a_cpu_backend(gpus, make_job):
    job = make_job(batch_size=4, number_gpus=gpus, fsdp_cpu_offload=True, **FSDP2)
    backend = training_kwargs(job, device_type="cuda", layer_classes=["LlamaDecoderLayer"])["ddp_backend"]
    assert _devices(backend) == {"cuda": "nccl", "cpu": "gloo"}
    # without offload, NCCL alone: torch has no backend for a CPU tensor's all-reduce there
    plain = job.config.replace(fsdp_cpu_offload=False)
    assert _devices(process_group_backend(plain, device_type="cuda")) == {"cuda": "nccl"}


def test_one_plain_process_has_no_group(make_job):
    job = make_job(batch_size=4, number_gpus=1, distributed_backend="DDP")
    assert process_group_backend(job.config, device_type="cuda") is None
    assert trial_command(job, runner="torchrun", out_dir="/o", port=1)[:3] == [
        sys.executable,
        "-m",
        "explorer.worker",
    ]
    assert rank_environments({"A": "1"}, world_size=1, port=1, process_group=job.config.process_group) == [
        {"A": "1"}
    ]


@pytest.mark.parametrize("runner", ["torchrun", "accelerate"])
def test_fsdp_on_one_gpu_starts_a_world_of_one(runner, make_job):
    job = make_job(batch_size=4, number_gpus=1, **FSDP2)
    cmd = trial_command(job, runner=runner, out_dir="/o", port=1234)
    assert cmd[1:3] == ["-m", "torch.distributed.run"]  # accelerate launch refuses --multi_gpu for 1
    assert cmd[cmd.index("--nproc_per_node") + 1] == "1"
    (env,) = rank_environments({}, world_size=1, port=1234, process_group=job.config.process_group)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("0", "0", "1", "1234")


@pytest.mark.parametrize(
    "config,start,wrapper",
    [
        (FSDP2, "warm", "FSDPModule:reshard_after_forward=True"),
        pytest.param(
            dict(distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="SHARD_GRAD_OP"),
            "cold",
            # torch's FSDP1 switches any strategy to NO_SHARD in a world of one; the record says so
            "FullyShardedDataParallel:NO_SHARD",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["fsdp2-warm", "fsdp1-cold"],
)
def test_fsdp_on_one_process_really_wraps_and_says_so(config, start, wrapper, make_job, tmp_path):
    """A real 1-process trial on gloo: the model trained is FSDP's, in a group of one."""
    job = make_job(batch_size=4, number_gpus=1, **config)
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, warm_start=start == "warm")
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["wrapper"] == wrapper
    assert m.extra["fsdp_wrapped"] is True
    assert m.extra["process_group"]["world_size"] == 1
    assert "gloo" in m.extra["process_group"]["backends"]
    assert m.extra["gradient_reduce_dtype"] == "float32"  # no mixed precision on the CPU
    optimizer = m.extra["optimizer"]
    assert (optimizer["class"], optimizer["fused"]) == ("torch.optim.adamw.AdamW", False)
    # Adam's two float32 states per weight (and a step count per tensor), the whole model on one rank
    assert optimizer["state_bytes"] == pytest.approx(8 * m.extra["trainable_parameters"], rel=0.01)


@pytest.mark.slow
def test_a_plain_one_process_trial_records_no_group(make_job, tmp_path):
    job = make_job(batch_size=4, number_gpus=1, distributed_backend="DDP")
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, warm_start=True)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["fsdp_wrapped"] is False
    assert m.extra["process_group"] == {"backends": "none", "world_size": 1}
    assert m.extra["gradient_reduce_dtype"] == "none"
