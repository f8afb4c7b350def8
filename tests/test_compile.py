"""Compiled trials (``torch_compile``, issue 15): the Trainer's compiled model is described without
``len()``, compile time stays in the warmup, and a compiled trial really runs on the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from explorer.launch import ensure_zygote, run_trial, zygote_environment
from explorer.measurement import Outcome
from explorer.spec import MeasurementSpec
from explorer.trial_config import TrialConfig
from explorer.worker._compile import (
    DYNAMIC_ENV,
    CompilePlan,
    compile_plan,
    compiling_steps,
    is_compiled,
    trained_model,
)
from explorer.worker._stopping import decide, warmup_at_least
from tests.builders import TINY_GRANITE


def _clock(durations: list[float], start: float = 100.0) -> list[float]:
    ends, t = [], start
    for d in durations:
        t += d
        ends.append(t)
    return ends


def test_compiling_steps_are_the_steps_whose_graph_count_grew():
    assert compiling_steps([]) == []
    assert compiling_steps([0, 0, 0]) == []
    assert compiling_steps([1, 1, 1]) == [1]
    assert compiling_steps([1, 2, 2, 5]) == [1, 2, 4]


def test_a_compiling_step_moves_into_the_warmup():
    """Step 2 recompiled (60 s): the measured window starts after it, under every stop rule."""
    durations = [90.0, 60.0] + [1.0] * 20
    ends = _clock(durations)
    steps = MeasurementSpec(warmup_steps=1, measured_steps=3)
    grown = warmup_at_least(steps, 2, start=100.0, ends=ends[:2])
    assert grown.warmup_steps == 2 and grown.measured_steps == 3
    assert not decide(grown, start=100.0, ends=ends[:4]).stop  # 2 measured steps only
    assert decide(grown, start=100.0, ends=ends[:5]).warmup == 2
    assert warmup_at_least(steps, 1, start=100.0, ends=ends[:1]) is steps  # already covered
    assert warmup_at_least(steps, 0, start=100.0, ends=[]) is steps
    timed = MeasurementSpec(stop="warmup_then_stable", warmup_seconds=60, stable_steps=3, stable_seconds=2)
    grown = warmup_at_least(timed, 2, start=100.0, ends=ends[:2])
    assert grown.warmup_seconds == 150.0
    d = decide(grown, start=100.0, ends=ends[:5])
    assert d.warmup == 2 and d.stop
    steady = MeasurementSpec(warmup_steps=1, min_steps=3, target_rel_ci=0.5, spike_factor=None)
    d = decide(warmup_at_least(steady, 2, start=100.0, ends=ends[:2]), start=100.0, ends=ends[:5])
    assert d.warmup == 2 and d.stop and d.reason == "stable"


def _config(**knobs: object) -> TrialConfig:
    return TrialConfig(
        batch_size=4, number_gpus=1, model_max_length=64, gradient_checkpointing=False, **knobs
    )


def test_dynamic_shapes_only_where_batches_change_shape():
    try:
        assert compile_plan(_config(torch_compile=True, padding="packed")) == CompilePlan(dynamic=True)
        assert os.environ[DYNAMIC_ENV] == "1"
        assert compile_plan(_config(torch_compile=True, padding="longest")) == CompilePlan(dynamic=True)
        assert compile_plan(_config(torch_compile=True)) == CompilePlan(dynamic=False)  # max_length
        assert DYNAMIC_ENV not in os.environ
        assert compile_plan(_config(padding="packed")) is None
        assert DYNAMIC_ENV not in os.environ
    finally:
        os.environ.pop(DYNAMIC_ENV, None)


def test_a_compiled_model_is_described_without_len(tmp_path):
    """The issue's error: ``model_wrapped or model`` took the truth value of accelerate's
    OptimizedModule, i.e. its len(). The wrapper and checkpointing are read through it instead
    (accelerate wraps lazily: nothing is compiled here)."""
    from transformers import AutoConfig, AutoModelForCausalLM, TrainingArguments

    from explorer.worker._timing import CountingTrainer
    from explorer.worker._train import _checkpointing_active, _describe_wrapper

    arch = dict(TINY_GRANITE)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch.pop("model_type"), **arch))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, torch_compile=True, report_to="none")
    trainer = CountingTrainer(model=model, args=args)
    trainer.model_wrapped = trainer.accelerator.prepare_model(trainer.model)
    assert isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)
    with pytest.raises(TypeError, match="does not support len"):
        bool(trainer.model_wrapped)
    assert trained_model(trainer) is model and is_compiled(trainer)
    assert _describe_wrapper(trainer) == "GraniteForCausalLM"
    assert not _checkpointing_active(trainer)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "padding", "gpus", "backend", "warm"),
    [("granite", "packed", 1, "NONE", True), ("llama", "max_length", 2, "DDP", False)],
)
def test_a_compiled_trial_runs_and_compiles_only_in_its_warmup(
    model, padding, gpus, backend, warm, make_job, tmp_path
):
    """A compiled trial end to end (ranks forked from the zygote, or torchrun's; inductor on the
    CPU, 20-60 s of compiling): a positive throughput, the trained model an OptimizedModule, every
    compile in the warmup. No memory cap: on the CPU it caps the address space, and the compiler's
    own memory (a recompile, above all) would count as the model's."""
    patch: dict = {"resources": {"device_memory_gib": None}}
    if model == "granite":
        patch["workload"] = {"model": {"name": "tiny-granite", "architecture": TINY_GRANITE}}
    job = make_job(
        patch,
        batch_size=4,
        number_gpus=gpus,
        distributed_backend=backend,
        padding=padding,
        torch_compile=True,
    )
    start: dict = {"warm_start": warm}
    if warm:
        start["zygote"] = ensure_zygote(
            owner_pid=os.getpid(), env=zygote_environment(cpu_count=os.cpu_count() or 1)
        )
    m = run_trial(job, work_dir=tmp_path / "trial", timeout_s=600, **start)
    assert m.outcome is Outcome.OK, m.error or m.log_tail[-2000:]
    assert m.extra["start"] == ("warm" if warm else "cold")
    p = m.properties
    assert p is not None and p.dataset_tokens_per_second > 0 and p.measured_steps == 3
    compiled = m.extra["compile"]
    assert compiled["compiled"] and compiled["graphs"] >= 1
    assert compiled["dynamic"] == (padding == "packed")
    assert compiled["compiling_steps"] and max(compiled["compiling_steps"]) <= p.warmup_steps
    assert m.extra["wrapper"] == ("GraniteForCausalLM" if backend == "NONE" else "DistributedDataParallel")
