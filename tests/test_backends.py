"""Every backend and sharding strategy really runs: real HF Trainer, real torchrun, gloo on CPU.

Each case asserts the wrapper the Trainer actually trained (DDP, FSDP1 with its strategy, FSDP2
with its resharding) and whether activation checkpointing was really applied.
"""

from __future__ import annotations

import os
import time

import pytest

from explorer.launch import run_trial, zygote_environment
from explorer.measurement import Outcome

CASES = [
    # (config, expected wrapper)
    (dict(number_gpus=1, distributed_backend="NONE", gradient_checkpointing=True), "LlamaForCausalLM"),
    (dict(number_gpus=2, distributed_backend="DDP"), "DistributedDataParallel"),
    (
        dict(number_gpus=2, distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="FULL_SHARD"),
        "FullyShardedDataParallel:FULL_SHARD",
    ),
    (
        dict(
            number_gpus=2,
            distributed_backend="FSDP",
            fsdp_version=1,
            fsdp_sharding_strategy="SHARD_GRAD_OP",
            gradient_checkpointing=True,
        ),
        "FullyShardedDataParallel:SHARD_GRAD_OP",
    ),
    (
        dict(number_gpus=2, distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="NO_SHARD"),
        "FullyShardedDataParallel:NO_SHARD",
    ),
    (
        dict(
            number_gpus=2,
            distributed_backend="FSDP",
            fsdp_version=2,
            fsdp_sharding_strategy="FULL_SHARD",
            gradient_checkpointing=True,
        ),
        "FSDPModule:reshard_after_forward=True",
    ),
    (
        dict(
            number_gpus=2, distributed_backend="FSDP", fsdp_version=2, fsdp_sharding_strategy="SHARD_GRAD_OP"
        ),
        "FSDPModule:reshard_after_forward=False",
    ),
]


def _id(case) -> str:
    c = case[0]
    return "-".join(
        str(v)
        for v in (c["distributed_backend"], c.get("fsdp_version"), c.get("fsdp_sharding_strategy"))
        if v
    ) + ("-ckpt" if c.get("gradient_checkpointing") else "")


@pytest.fixture(params=["warm", "cold"])
def start(request) -> dict:
    """Run each case both ways: ranks forked from the zygote, and fresh interpreters under torchrun."""
    return {"warm_start": request.param == "warm"}


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_backend_really_runs(case, start, make_job, tmp_path):
    config, wrapper = case
    job = make_job(batch_size=4, **config)
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, **start)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["start"] == ("warm" if start["warm_start"] else "cold")
    assert m.extra["wrapper"] == wrapper
    assert m.extra["checkpointing"] == ("on" if config.get("gradient_checkpointing") else "off")
    p = m.properties
    assert p is not None and p.measured_steps == 3 and p.warmup_steps == 1
    assert p.dataset_tokens_per_second > 0
    assert p.dataset_tokens_per_second_per_gpu == pytest.approx(
        p.dataset_tokens_per_second / config["number_gpus"]
    )
    # padding is counted in train tokens only: the synthetic entries are 16..96 tokens, cut at 64
    assert p.measured_train_tokens == p.measured_samples * 64
    assert 0 < p.measured_dataset_tokens < p.measured_train_tokens


@pytest.mark.parametrize("backend", ["DDP", "FSDP2"])
def test_lora_through_peft(backend, make_job, tmp_path):
    fsdp = dict(fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD") if backend == "FSDP2" else {}
    job = make_job(
        {
            "workload": {
                "method": {"kind": "lora", "r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
            }
        },
        batch_size=4,
        number_gpus=2,
        distributed_backend="FSDP" if fsdp else "DDP",
        **fsdp,
    )
    assert job.config.lora_r == 8
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["trainable_parameters"] < m.extra["total_parameters"] / 10


def test_forced_oom_is_classified_and_fails_fast(start, make_job, tmp_path):
    """A batch far beyond the 0.5 GiB cap fails in its first step with a real allocation failure."""
    job = make_job(batch_size=512, number_gpus=2, distributed_backend="DDP")
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, **start)
    assert m.outcome is Outcome.OOM
    assert "can't allocate memory" in (m.error or "")
    assert m.properties is None and m.is_valid == 0


def test_crash_is_failed_not_oom(start, make_job, tmp_path):
    """Any other error (here: an optimizer name HF does not know) is FAILED with the error text."""
    job = make_job(batch_size=4, number_gpus=2, distributed_backend="DDP", optim="no_such_optimizer")
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=240, **start)
    assert m.outcome is Outcome.FAILED
    assert "no_such_optimizer" in (m.error or "")


def _is_zygote(proc) -> bool:
    """A zygote itself (not one of its forked ranks, which share its command line)."""
    import psutil

    try:
        parent = " ".join(proc.parent().cmdline()) if proc.parent() else ""
        return "explorer.worker.zygote" in " ".join(proc.cmdline()) and "explorer.worker.zygote" not in parent
    except psutil.NoSuchProcess:
        return True


def test_timeout_kills_the_whole_process_group(start, make_job, tmp_path):
    import psutil

    from explorer.launch._warm import ensure_zygote

    job = make_job(  # a trial that would train for 2 minutes (a warm start is done within 3 s otherwise)
        {"measurement": {"stop": "seconds", "stop_after_seconds": 120, "trial_timeout_s": 240}},
        batch_size=4,
        number_gpus=2,
        distributed_backend="DDP",
    )
    # the zygote itself outlives trials; every rank (its children, or torchrun's) must not
    sock = (
        ensure_zygote(owner_pid=os.getpid(), env=zygote_environment(cpu_count=2))
        if start["warm_start"]
        else None
    )
    before = {p.pid for p in psutil.process_iter()}
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=3, zygote=sock, **start)
    assert m.outcome is Outcome.FAILED and "timed out" in (m.error or "")

    def leftovers() -> list[dict]:
        return [
            p.info
            for p in psutil.process_iter(["pid", "cmdline"])
            if p.pid not in before
            and "explorer.worker" in " ".join(p.info["cmdline"] or [])
            and not _is_zygote(p)  # a zygote another test's Ray host was still starting; not a rank
        ]

    # A rank the zygote was still forking when the timeout struck is not in the killed group; it
    # sees that its trial is gone and exits by itself within a second or two (seen once in ~10
    # full runs, on a loaded machine). Nothing may be left after that.
    deadline = time.monotonic() + 10
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert leftovers() == []


def test_accelerate_launch_runner(make_job, tmp_path):
    """The same worker under `accelerate launch` (the seeds' runner) instead of torchrun."""
    job = make_job(
        batch_size=4,
        number_gpus=2,
        distributed_backend="FSDP",
        fsdp_version=2,
        fsdp_sharding_strategy="FULL_SHARD",
    )
    m = run_trial(job, work_dir=tmp_path / "trial", runner="accelerate", timeout_s=240)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["wrapper"] == "FSDPModule:reshard_after_forward=True"
