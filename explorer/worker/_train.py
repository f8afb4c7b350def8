"""One rank of a trial: build the job, train under the HF Trainer, report what was measured.

Run as ``python -m explorer.worker --job JSON --out DIR``, once per GPU (torchrun or accelerate
launch start the processes). Rank 0 writes ``result.json`` (a :class:`Measurement`); a rank that
raises writes ``error-rank<r>.json`` with the classified outcome, then exits non-zero. Every rank
first writes ``rank-<r>.json``: where it runs (host, node rank, the Ray node its launcher named).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from explorer.fault import WORKER_FAULTS
from explorer.flops import FlopModel, peak_flops_for
from explorer.job import TrialJob
from explorer.knobs import run_options
from explorer.measurement import Measurement, Outcome, Properties
from explorer.oom import failure_line
from explorer.settings import BENCHMARK_ONLY, fsdp_environment, process_group_backend, training_kwargs
from explorer.trial_config import TrialConfig
from explorer.worker._compile import compile_plan, compile_record, trained_model
from explorer.worker._memory import MemoryCap, is_oom, memory_figures, memory_limit_bytes, peak_memory_bytes
from explorer.worker._metrics import SystemSampler, fingerprint, load_nvml, trial_pids
from explorer.worker._stopping import Decision, relative_ci
from explorer.worker._worst_case import worst_case_step

__all__ = [
    "training_dataset",
    "BENCHMARK_ONLY",
    "main",
    "process_group_backend",
    "process_group_record",
    "run_rank",
    "training_arguments",
    "training_kwargs",
]

GIB = 2**30


class Phases:
    """Seconds from the rank's start to each phase it reached (to see where a trial's time went)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.at(name, time.perf_counter())

    def at(self, name: str, perf_counter: float) -> None:
        self.seconds[name] = round(perf_counter - self.t0, 4)


PHASES = Phases()
"""This rank's phases; restarted by :func:`main` (a forked rank inherits the zygote's)."""


def pick_device(requested: str) -> torch.device:
    """The training device for this rank (``auto``: CUDA when the process sees a GPU)."""
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def training_arguments(
    job: TrialJob, *, device: torch.device, output_dir: str, layer_classes: list[str] | None
) -> Any:
    """The TrainingArguments for ``job.config`` (:func:`explorer.settings.training_kwargs`), with
    the environment they need (FSDP1's strategy: :func:`explorer.settings.fsdp_environment`).
    Liger is left out: the worker patches it itself, to record what changed."""
    from transformers import TrainingArguments

    os.environ.update(fsdp_environment(job.config))
    kwargs = training_kwargs(
        job, device_type=device.type, layer_classes=layer_classes, liger_in_trainer=False
    )
    return TrainingArguments(output_dir=output_dir, max_steps=job.measurement.step_budget, **kwargs)


def _arguments(
    job: TrialJob, *, device: torch.device, output_dir: str, layer_classes: list[str] | None
) -> Any:
    """The trainer's arguments: ``TrainingArguments``, or TRL's ``SFTConfig`` (``trainer: trl``)."""
    if job.workload.trainer == "trl":
        from explorer.worker._trl import sft_arguments

        return sft_arguments(job, device_type=device.type, output_dir=output_dir, layer_classes=layer_classes)
    return training_arguments(job, device=device, output_dir=output_dir, layer_classes=layer_classes)


def _trainer(job: TrialJob, *, model: Any, args: Any, callbacks: list[Any], vocab_size: int) -> Any:
    """The counting trainer of the study's ``workload.trainer``: the ``Trainer`` over explorer's
    dataset and collator, or TRL's ``SFTTrainer`` over TRL's preparation of the JSONL file."""
    if job.workload.trainer == "trl":
        from explorer.worker._model import build_tokenizer
        from explorer.worker._trl import sft_trainer

        tokenizer = build_tokenizer(job.workload.model, job.model_path)
        return sft_trainer(job, model=model, args=args, callbacks=callbacks, tokenizer=tokenizer)
    from explorer.settings import collator_for
    from explorer.worker._timing import CountingTrainer

    return CountingTrainer(
        model=model,
        args=args,
        train_dataset=training_dataset(job, vocab_size=vocab_size),
        callbacks=callbacks,
        data_collator=collator_for(**run_options(job.config, "data_option")),
    )


def process_group_record() -> dict[str, Any]:
    """The process group this rank really trained in: its backends per device type and size."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {"backends": "none", "world_size": 1}
    return {"backends": dist.get_backend_config(), "world_size": dist.get_world_size()}


def run_rank(job: TrialJob, out_dir: Path) -> Measurement | None:
    """Train this rank's share of the trial; rank 0 returns the aggregated measurement."""
    from explorer.worker._apply import unmet_needs
    from explorer.worker._model import decoder_layer_classes, load_config
    from explorer.worker._timing import StepClock, StepLog
    from explorer.worker._trl import trainer_record

    c = job.config
    device = pick_device(job.resources.device)
    cap_gib = job.resources.device_memory_gib
    cap = MemoryCap(int(cap_gib * GIB) if cap_gib else None, device)
    with tempfile.TemporaryDirectory(prefix="explorer-trainer-") as tmp:
        config = load_config(job.workload.model, job.model_path)
        unmet_needs(c, device_type=device.type, model_type=getattr(config, "model_type", None))
        layers = decoder_layer_classes(config) if c.distributed_backend == "FSDP" else None
        args = _arguments(job, device=device, output_dir=tmp, layer_classes=layers)
        _ = args.device  # initialises the process group (gloo / nccl)
        PHASES.mark("process_group")
        cap.mark_baseline()  # from here on, the model, its states and activations count
        model, applied = _model(job, config, device)
        PHASES.mark("model_built")
        flops = _flop_model(model, config, c)  # before FSDP flattens and shards the weights
        parameters = _parameter_counts(model)
        log = StepLog()
        plan = compile_plan(c)  # before the Trainer: accelerate reads the shapes setting then
        clock = StepClock(log, device=device, spec=job.measurement, compiled=plan is not None)
        callbacks: list[Any] = [clock]
        if job.fault is not None and job.fault.kind in WORKER_FAULTS:
            from explorer.worker._fault import FaultCallback

            callbacks.append(FaultCallback(job.fault, device=device))
        trainer = _trainer(job, model=model, args=args, callbacks=callbacks, vocab_size=config.vocab_size)
        trainer.step_log = log
        rank0 = int(os.environ.get("RANK", "0")) == 0
        nvml, sampler = _start_sampler(out_dir) if rank0 else (None, None)
        cap.enforce()
        PHASES.mark("trainer_ready")
        try:
            trainer.train()
            # after the measured window, never timed: the peak of the longest batch the run can meet
            worst = worst_case_step(trainer, job, vocab_size=config.vocab_size, baseline_rss=cap.baseline_rss)
        finally:
            cap.release()
            if sampler is not None:
                sampler.stop()
        if log.ends:
            PHASES.at("first_step", log.ends[0])
        extra = {**_extra(trainer, model, parameters, fingerprint(nvml=nvml) if rank0 else None), **applied}
        extra.update(
            _group_record(trainer), optimizer=_optimizer_record(trainer), trainer=trainer_record(trainer)
        )
        if sampler is not None and nvml is not None:
            extra["nvml"] = sampler.record()  # the GPUs read, by UUID, and whose memory counted
        extra["worst_case_step"] = worst
        if plan is not None:
            extra["compile"] = compile_record(trainer, log.compiles, plan)
        if job.workload.training_arguments:  # as the Trainer really holds them
            held = trainer.args.to_dict()
            extra["training_arguments"] = {k: held[k] for k in job.workload.training_arguments}
        window = clock.decision.warmup
        since = log.ends[window - 1] if window and len(log.ends) >= window else (log.start or 0.0)
        system = sampler.summary(since=since) if sampler is not None else {}
        return _aggregate(
            job,
            log,
            device,
            extra,
            baseline_rss=cap.baseline_rss,
            limit=memory_limit_bytes(cap.cap_bytes, device, processes_here=_local_processes()),
            decision=clock.decision,
            flops=flops,
            system=system,
        )


def _start_sampler(out_dir: Path) -> tuple[Any, SystemSampler]:
    """Rank 0's NVML handle (None without NVML) and its started system sampler over the trial's pids."""
    nvml = load_nvml()
    sampler = SystemSampler(nvml=nvml, pids=lambda: trial_pids(out_dir))
    sampler.start()
    return nvml, sampler


def _local_processes() -> int:
    """The trial's processes on this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 without it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def _model(job: TrialJob, config: Any, device: torch.device) -> tuple[Any, dict[str, Any]]:
    """The model, the knobs the worker applies itself applied, and what they did."""
    from explorer.settings import model_kwargs
    from explorer.worker._model import build_model

    c = job.config
    options = model_kwargs(c)  # as a user's run builds it (run_settings.json)
    dtype = getattr(torch, options.pop("dtype"))
    model = build_model(
        job.workload.model,
        job.model_path,
        config,
        lora_r=c.lora_r,
        method=job.workload.method,
        # every rank holds the whole model anyway (one process or DDP): build it on the GPU
        init_device=device if device.type == "cuda" and c.distributed_backend != "FSDP" else None,
        options=options,
        dtype=dtype,
    )
    return model, _apply_knobs(model, c, liger_by_trainer=job.workload.trainer == "trl")


def _apply_knobs(model: Any, c: TrialConfig, *, liger_by_trainer: bool = False) -> dict[str, Any]:
    """Liger's kernels and selective checkpointing, applied to the model before the Trainer
    wraps it; what was really applied, for the measurement's ``extra``. ``liger_by_trainer``:
    TRL applies Liger itself (``use_liger_kernel``), as a user's ``SFTTrainer`` would."""
    from explorer.settings import apply_liger, apply_selective_checkpointing, selective_checkpointing

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    applied: dict[str, Any] = {
        "weights_dtype": str(next(base.parameters()).dtype).removeprefix("torch."),
        "attention_in_model": getattr(base.config, "_attn_implementation", None),
    }
    if liger_by_trainer:
        applied["liger"] = "use_liger_kernel" if c.liger_kernel else "off"
    else:
        applied.update(apply_liger(model, c))
    if selective_checkpointing(c):
        applied.update(apply_selective_checkpointing(model, c.checkpoint_fraction))
    return applied


def training_dataset(job: TrialJob, *, vocab_size: int) -> Any:
    """The training data: a JSONL file through the model's tokenizer, or synthetic tokens."""
    from explorer.worker._data import JsonlText, SyntheticTokens, filled
    from explorer.worker._model import build_tokenizer

    length = job.config.model_max_length
    if job.workload.dataset.kind == "jsonl":
        data: Any = JsonlText(
            Path(job.dataset_path or ""),
            text_field=job.workload.dataset.text_field,
            tokenizer=build_tokenizer(job.workload.model, job.model_path),
            max_length=length,
        )
    else:
        data = SyntheticTokens(job.workload.dataset, vocab_size=vocab_size, max_length=length)
    return filled(data, job.config.global_batch)  # every step a full batch, however few the entries


def _parameter_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters, before FSDP flattens and shards them."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def _extra(trainer: Any, model: Any, parameters: tuple[int, int], fingerprint: Any) -> dict[str, Any]:
    """What a measurement records beside its figures: phases, wrapper, checkpointing, parameter
    counts, and (rank 0) the software and hardware fingerprint."""
    extra: dict[str, Any] = {
        "phases": PHASES.seconds,
        "wrapper": _describe_wrapper(trainer),
        "checkpointing": "on" if _checkpointing_active(trainer) else "off",
        "trainable_parameters": parameters[0],
        "total_parameters": parameters[1],
    }
    if fingerprint is not None:
        extra["fingerprint"] = fingerprint
    return extra


def _group_record(trainer: Any) -> dict[str, Any]:
    """What really ran across processes: the process group's backends, whether FSDP wrapped the
    model, and the dtype its gradients are reduced in (FSDP's mixed precision reduces in bf16
    where DDP reduces the float32 master gradients)."""
    from torch.distributed.fsdp import FSDPModule

    wrapped = trained_model(trainer)
    fsdp2 = next((m for m in (wrapped, trainer.model) if isinstance(m, FSDPModule)), None)
    fsdp1 = getattr(wrapped, "mixed_precision", None) if hasattr(wrapped, "sharding_strategy") else None
    weights = next(trainer.model.parameters()).dtype
    if fsdp2 is not None:
        policy = fsdp2._get_fsdp_state()._mp_policy
        reduce = policy.reduce_dtype or policy.param_dtype or weights
    elif fsdp1 is not None:
        reduce = fsdp1.reduce_dtype or fsdp1.param_dtype or weights
    else:  # DDP all-reduces the gradients as they are: in the weights' dtype
        reduce = weights
    group = process_group_record()
    return {
        "process_group": group,
        "fsdp_wrapped": fsdp2 is not None or hasattr(wrapped, "sharding_strategy"),
        "gradient_reduce_dtype": str(reduce).removeprefix("torch.")
        if group["backends"] != "none"
        else "none",
    }


def _optimizer_record(trainer: Any) -> dict[str, Any]:
    """The optimizer as the Trainer built it (accelerate's wrapper removed): its class, whether
    it runs the fused CUDA kernel, and the bytes of state this rank holds (Adam: 8 per weight in
    float32; 8-bit states about 2; Adafactor's factored ones far fewer), so that a trial shows
    which optimizer really stepped."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    groups = getattr(optimizer, "param_groups", None) or [{}]
    tensors = [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]  # FSDP2: this rank's shard
    cls = type(optimizer)
    return {
        "class": f"{cls.__module__}.{cls.__name__}",
        "fused": bool(groups[0].get("fused")),
        "state_bytes": sum(t.numel() * t.element_size() for t in local),
    }


def _checkpointing_active(trainer: Any) -> bool:
    """Whether activation checkpointing is really applied (HF flag, or FSDP checkpoint wrappers)."""
    model = trained_model(trainer)
    if any(
        type(m).__name__ == "CheckpointWrapper" or hasattr(m, "_checkpoint_wrapped_module")
        for m in model.modules()
    ):
        return True
    base = trainer.model
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    flag = (
        "is_activation_checkpointing"
        if hasattr(base, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    return bool(getattr(base, flag, False))


def _describe_wrapper(trainer: Any) -> str:
    """Type of the model as trained (DDP, FullyShardedDataParallel, FSDP2 module, or plain)."""
    wrapped = trained_model(trainer)
    name = type(wrapped).__name__
    from torch.distributed.fsdp import FSDPModule

    if isinstance(wrapped, FSDPModule) or isinstance(trainer.model, FSDPModule):
        root = wrapped if isinstance(wrapped, FSDPModule) else trainer.model
        return f"FSDPModule:reshard_after_forward={_fsdp2_reshards(root)}"
    strategy = getattr(wrapped, "sharding_strategy", None)
    return f"{name}:{strategy.name}" if strategy is not None else name


def _fsdp2_reshards(root: Any) -> bool:
    """FSDP2: whether decoder layers reshard after forward (FULL_SHARD) or keep parameters
    gathered (SHARD_GRAD_OP). Read from the first wrapped layer below the root."""
    from torch.distributed.fsdp import FSDPModule

    for name, module in root.named_modules():
        if name and isinstance(module, FSDPModule):
            groups = module._get_fsdp_state()._fsdp_param_groups
            if groups and ".layers." in f".{name}.":
                return groups[0].post_forward_mesh_info is not None
    return False


def _flop_model(model: Any, config: Any, c: TrialConfig) -> FlopModel:
    """FLOPs per token of this model: linear weights (frozen and trainable), layers, hidden size."""
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    n_linear = sum(m.weight.numel() for m in linear)
    n_trainable = sum(m.weight.numel() for m in linear if m.weight.requires_grad)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return FlopModel(
        n_linear=n_linear,
        n_trainable_linear=n_trainable,
        layers=int(text.num_hidden_layers),
        hidden=int(text.hidden_size),
        seq_len=c.model_max_length,
        lora=c.lora_r is not None,
        checkpointing=c.checkpoint_fraction if c.gradient_checkpointing else 0.0,
    )


def _peak_flops(device: torch.device, gpu_model: str) -> float:
    """Peak FLOP/s of one device: the data-sheet table on CUDA; a measured matmul peak on CPU."""
    if device.type == "cuda":
        return peak_flops_for(torch.cuda.get_device_name(device)) or peak_flops_for(gpu_model) or float("nan")
    return measure_cpu_matmul_flops()


def measure_cpu_matmul_flops(size: int = 512, seconds: float = 0.3) -> float:
    """Float32 matmul FLOP/s of this process with its torch threads (the CPU's "peak")."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    torch.mm(a, b)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        n += 1
    return 2.0 * size**3 * n / (time.perf_counter() - start)


def _per_step(cumulative: list[int], warmup: int) -> list[int]:
    """Each measured step's share of a cumulative per-step count (the steps after ``warmup``)."""
    before = cumulative[warmup - 1] if warmup else 0
    return [b - a for a, b in zip([before, *cumulative[warmup:-1]], cumulative[warmup:], strict=True)]


def _aggregate(
    job: TrialJob,
    log: Any,
    device: torch.device,
    extra: dict[str, Any],
    *,
    baseline_rss: int,
    limit: int,
    decision: Decision,
    flops: FlopModel,
    system: dict[str, float],
) -> Measurement | None:
    import torch.distributed as dist

    w = decision.warmup
    steps = len(log.ends)
    if steps <= w:
        raise RuntimeError(f"training stopped after {steps} steps, before the end of {w} warmup steps")
    begin = log.ends[w - 1] if w else log.start
    base = (log.dataset_tokens[w - 1], log.train_tokens[w - 1], log.samples[w - 1]) if w else (0, 0, 0)
    peak_reserved, peak_alloc = peak_memory_bytes(device, baseline_rss=baseline_rss)
    ends = (log.dataset_tokens[-1], log.train_tokens[-1], log.samples[-1])
    totals = [e - b for e, b in zip(ends, base, strict=True)]
    counts = torch.tensor(totals + _per_step(log.dataset_tokens, w), dtype=torch.float64)
    peaks = torch.tensor([peak_reserved, peak_alloc], dtype=torch.float64)
    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        comm = "cuda" if device.type == "cuda" else "cpu"
        counts, peaks = counts.to(comm), peaks.to(comm)
        dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    memory = memory_figures(float(peaks[0]), float(peaks[1]), limit)  # over the limit: OOM, every rank
    if distributed and dist.get_rank() != 0:
        return None
    seconds = log.ends[-1] - begin
    measured_steps = steps - w
    durations = [b - a for a, b in zip([begin, *log.ends[w:-1]], log.ends[w:], strict=True)]
    mean_step = sum(durations) / len(durations)
    sd = (
        (sum((d - mean_step) ** 2 for d in durations) / (len(durations) - 1)) ** 0.5
        if len(durations) > 1
        else 0.0
    )
    summed = [int(x) for x in counts.cpu().tolist()]
    dataset_tokens, train_tokens, samples = summed[:3]
    gpus = job.config.number_gpus
    dtps = dataset_tokens / seconds
    peak = _peak_flops(device, job.resources.model_of(job.config.gpu_model))  # the trial's model
    per_device = train_tokens / seconds / gpus
    props = Properties(
        dataset_tokens_per_second=dtps,
        dataset_tokens_per_second_per_gpu=dtps / gpus,
        train_tokens_per_second=train_tokens / seconds,
        train_runtime=log.ends[-1] - log.start,
        train_samples_per_second=samples / seconds,
        train_steps_per_second=measured_steps / seconds,
        measured_steps=measured_steps,
        warmup_steps=w,
        measured_seconds=seconds,
        warmup_seconds=begin - log.start,
        step_time_mean=mean_step,
        step_time_cv=sd / mean_step if mean_step > 0 else 0.0,
        step_time_rel_ci=relative_ci(durations) if len(durations) > 1 else None,
        stop_reason=decision.reason or ("end of data" if not decision.stop else ""),
        model_flops_per_token=flops.model_flops_per_token,
        peak_flops=peak,
        mfu=flops.mfu(tokens_per_second_per_device=per_device, peak_flops=peak),
        hfu=flops.hardware_flops_per_token * per_device / peak,
        system=system,
        measured_dataset_tokens=dataset_tokens,
        measured_train_tokens=train_tokens,
        measured_samples=samples,
        device=device.type,
        **memory,
    )
    # per measured step: its seconds and the dataset tokens all ranks trained in it
    extra = {**extra, "step_times": [round(d, 6) for d in durations], "step_dataset_tokens": summed[3:]}
    return Measurement(outcome=Outcome.OK, properties=props, extra=extra)


def rank_record(env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, Any]:
    """Where this rank runs, from what torchrun and the launcher put in its environment."""
    import socket

    def number(name: str, default: int) -> int:
        return int(env.get(name, default))

    return {
        "rank": number("RANK", 0),
        "local_rank": number("LOCAL_RANK", 0),
        "node_rank": number("GROUP_RANK", 0),
        "world_size": number("WORLD_SIZE", 1),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "ray_node": env.get("EXPLORER_RAY_NODE"),
        "raylet_pid": env.get("EXPLORER_RAYLET_PID"),
    }


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _exit_with_owner() -> None:
    """Exit this rank when the process that launched the trial (the Ray actor) is gone.

    A killed driver or actor must leave no training processes behind; torchrun's ranks run in
    sessions of their own, so they would not receive the actor's death otherwise.
    """
    import threading

    import psutil

    owner = os.environ.get("EXPLORER_OWNER_PID")
    if not owner:
        return
    try:
        proc = psutil.Process(int(owner))
    except psutil.NoSuchProcess:
        os._exit(1)

    def watch() -> None:
        while True:
            try:
                if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="explorer-owner-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m explorer.worker")
    parser.add_argument("--job", required=True, help="TrialJob as JSON")
    parser.add_argument("--out", required=True, help="folder for result.json / error-rank<r>.json")
    ns = parser.parse_args(argv)
    global PHASES
    PHASES = Phases()
    _exit_with_owner()
    job = TrialJob.from_json(ns.job)
    out = Path(ns.out)
    rank = int(os.environ.get("RANK", "0"))
    out.mkdir(parents=True, exist_ok=True)
    _write(out / f"rank-{rank}.json", json.dumps(rank_record()))
    try:
        measurement = run_rank(job, out)
    except BaseException as exc:  # classify every failure of this rank, then exit non-zero
        outcome = Outcome.OOM if is_oom(exc) else Outcome.FAILED
        text = failure_line(exc)  # CUDA's messages go on with advice about CUDA_LAUNCH_BLOCKING
        PHASES.mark("failed")
        _write(
            out / f"error-rank{rank}.json",
            json.dumps({"outcome": outcome.value, "error": text, "rank": rank, "phases": PHASES.seconds}),
        )
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3 if outcome is Outcome.OOM else 1)  # skip teardown that may hang on a broken group
    if measurement is not None:
        measurement = Measurement(
            outcome=measurement.outcome,
            properties=measurement.properties,
            wall_seconds=time.perf_counter() - PHASES.t0,
            extra=measurement.extra,
        )
        _write(out / "result.json", measurement.to_json())
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # without it, FSDP1 ranks sometimes abort at exit ("terminate called ...")
        dist.destroy_process_group()
    return 0
