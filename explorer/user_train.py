"""A stock user script: train ``explorer best``'s configuration from the written files alone.

It stands for a user's own script: a plain ``transformers.Trainer`` (or TRL's ``SFTTrainer``) fed
with what ``explorer best`` wrote, and nothing of the benchmark's worker::

    FSDP_SHARDING_STRATEGY=... torchrun --standalone --nproc_per_node N -m explorer.user_train --settings best/
    accelerate launch --config_file best/accelerate.yaml -m explorer.user_train --settings best/
    torchrun --standalone --nproc_per_node N -m explorer.user_train --settings best/ --trainer sft

(``explorer best`` prints these, with the environment each needs, and writes them into
``run_settings.json``.) It reads, from ``--settings``:

* ``training_arguments.json`` (and ``benchmark_arguments.json`` beneath it, where present):
  ``TrainingArguments(**...)``; ``--trainer sft``: ``sft_config.json``, ``SFTConfig(**...)``;
* ``run_settings.json``: :meth:`explorer.settings.RunSettings.prepare_model` on the model
  (the environment, some layers checkpointed) and, for a plain Trainer,
  :meth:`~explorer.settings.RunSettings.data_collator` (padding, packing); the model's keywords
  and LoRA adapters (:meth:`~explorer.settings.RunSettings.peft_config`);
* ``job.json``: the model only (its architecture or path; ``workload.model``).

The data are synthetic token entries of varied lengths up to ``model_max_length`` (``--data``: a
JSONL file of ``{"input_ids": [...]}`` instead). On the CPU a configuration with FSDP needs the
CPU shim :class:`explorer.settings.FsdpOnCpu` (accelerate ignores FSDP there): the script uses it
where the arguments say ``use_cpu`` and FSDP, and says so (``cpu_fsdp_shim``). On CUDA the
files alone shard.

Each rank writes ``facts-rank<r>.json`` into ``--out``: what really trained, read from the
Trainer after training (:func:`facts`): the model's wrapper (``FSDPModule``,
``FullyShardedDataParallel``, ``DistributedDataParallel`` or the model's class), FSDP2's
``reshard_after_forward`` or FSDP1's sharding strategy, the decoder layers that were checkpointed
(those whose parts ran forward more often than the embedding: recomputed in the backward), the data
collator's class and the first batch's shape and keys (``packed``: one row of entries with position
ids), the optimizer's class and whether Liger was asked for. A launch that fails (Liger without
the ``liger_kernel`` package: the Trainer's own error) writes them as far as they go (the first
batch its dataloader makes, untrained), with ``error``, and exits non-zero. ``--settings`` that
cannot be read: one line, exit 2.

Each record also holds ``measurement`` (:func:`measure`), taken the benchmark's way: the
worker's step clock (:class:`explorer.worker._timing.StepClock`, a ``TrainerCallback``) at every
optimizer step, the dataset tokens of every micro-batch the model is fed (its attention mask's
sum; a packed batch's every token), summed over the ranks; the window after the warmup the job's
own stop rule gives (``job.json``'s ``measurement``: its warmup steps, extended past one-off
spikes as the trial's was); dataset tokens per second per process, the step times and their
95% interval, and the peak memory (CPU: the resident set above the process before the model was
built, as the worker counts it). ``--memory-cap-gib``: the study's ``device_memory_gib`` on the
CPU, enforced as its trials ran (:class:`explorer.worker._memory.MemoryCap`, ``RLIMIT_AS``), so
that a configuration runs out of memory here where it would there (``explorer verify`` passes it).

Reuse: :func:`facts` reads a trained Trainer; the counters (``_Counter``) and the batch recorder
(``_FirstBatch``) must be in place before training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from explorer.settings import FsdpOnCpu, RunSettings, SettingsError, decoder_layers

__all__ = ["facts", "main", "measure", "synthetic_entries"]


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{path}: cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: not a JSON object")
    return data


def synthetic_entries(n: int, *, max_length: int, vocab_size: int) -> list[list[int]]:
    """``n`` token entries of lengths spread over ``[max_length / 4, max_length]`` (ids from 2 up:
    0 pads, 1 ends)."""
    low = max(2, max_length // 4)
    out = []
    for i in range(n):
        length = low + (i * 7919) % (max_length - low + 1)
        out.append([(i * 31 + j * 7) % (vocab_size - 2) + 2 for j in range(length)])
    return out


def _entries(path: str | None, *, n: int, max_length: int, vocab_size: int) -> list[list[int]]:
    """The training entries, truncated to ``max_length``: ``path``'s ``input_ids``, or synthetic."""
    if path is None:
        return synthetic_entries(n, max_length=max_length, vocab_size=vocab_size)
    lines = Path(path).read_text().splitlines()
    return [list(json.loads(line)["input_ids"])[:max_length] for line in lines if line.strip()]


def _model(job: dict[str, Any], run: RunSettings) -> Any:
    """The model of ``job.json``'s ``workload.model`` with ``run_settings.json``'s keywords (and its
    LoRA adapters, where it names them)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = job["workload"]["model"]
    kwargs = dict(run.model_kwargs)
    kwargs["dtype"] = getattr(torch, kwargs.get("dtype", "float32"))
    torch.manual_seed(0)
    if spec.get("architecture"):
        arch = dict(spec["architecture"])
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(job.get("model_path") or spec["path"], **kwargs)
    model.config.use_cache = False
    peft = run.peft_config()  # LoRA: as the benchmark trained it
    if peft is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft)
    return model


def _tokenizer(model: Any) -> Any:
    """A tokenizer for TRL's SFTTrainer (it reads the pad token from one): a word-level one over the
    model's ids, ``<pad>`` = 0, ``<eos>`` = 1 (the entries come as token ids)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    size = int(model.config.get_text_config().vocab_size)
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, size)}}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


class _Counter:
    """Forward calls per module, counted on its direct children (transformers checkpoints a layer's
    ``forward``, and the backward's recompute runs its children's ``forward`` again; module hooks
    do not see a recompute, so each child's ``forward`` is wrapped instead)."""

    def __init__(self, modules: list[Any], *, children: bool = True) -> None:
        self.calls: list[list[int]] = []
        for i, m in enumerate(modules):
            parts = list(m.children()) if children else [m]
            self.calls.append([0] * len(parts))
            for j, part in enumerate(parts):
                part.forward = self._counted(part.forward, i, j)

    def _counted(self, forward: Any, i: int, j: int) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[i][j] += 1
            return forward(*args, **kwargs)

        return counted

    @property
    def counts(self) -> list[int]:
        return [max(c, default=0) for c in self.calls]


class _FirstBatch:
    """A data collator that remembers the first batch it made (keys, shape, position ids)."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate
        self.seen: dict[str, Any] | None = None

    def __call__(self, items: Any) -> Any:
        batch = self.collate(items)
        if self.seen is None:
            positions = batch.get("position_ids")
            self.seen = {
                "keys": sorted(batch.keys()),
                "shape": list(batch["input_ids"].shape),
                "entries": int(positions.eq(0).sum()) if positions is not None else len(items),
                "items": len(items),
            }
        return batch


def _wrapper(trainer: Any) -> dict[str, Any]:
    """The model as trained: its wrapper, and how FSDP shards it."""
    from torch.distributed.fsdp import FSDPModule

    wrapped = getattr(trainer, "model_wrapped", None)
    wrapped = trainer.model if wrapped is None else wrapped  # never `or`: a compiled model has no truth value
    wrapped = getattr(wrapped, "_orig_mod", wrapped)  # torch.compile's wrapper
    root: Any = next((m for m in (wrapped, trainer.model) if isinstance(m, FSDPModule)), None)
    if root is not None:
        reshards = None
        for name, module in root.named_modules():
            if name and isinstance(module, FSDPModule):
                groups = module._get_fsdp_state()._fsdp_param_groups
                if groups:
                    reshards = groups[0].post_forward_mesh_info is not None
                    break
        return {"wrapper": "FSDPModule", "reshard_after_forward": reshards, "sharding_strategy": None}
    strategy = getattr(wrapped, "sharding_strategy", None)
    return {
        "wrapper": type(wrapped).__name__,
        "reshard_after_forward": None,
        "sharding_strategy": strategy.name if strategy is not None else None,
    }


def facts(trainer: Any, *, layers: _Counter, embedding: _Counter, first: _FirstBatch) -> dict[str, Any]:
    """What this rank really trained (see the module's docstring)."""
    import torch.distributed as dist

    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # None: never stepped
    cls = type(optimizer)
    collator = first.collate
    batch = first.seen or {}
    return {
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "trainer": type(trainer).__name__,
        "cpu_fsdp_shim": bool(getattr(trainer, "cpu_fsdp_shim", False)),
        **_wrapper(trainer),
        "layers": len(layers.counts),
        "checkpointed_layers": [i for i, n in enumerate(layers.counts) if n > embedding.counts[0]],
        "collator": f"{type(collator).__module__}.{type(collator).__name__}",
        "batch": batch,
        "packed": "position_ids" in batch.get("keys", ()) and batch.get("shape", [0])[0] == 1,
        "optimizer": f"{cls.__module__}.{cls.__name__}" if optimizer is not None else None,
        "use_liger_kernel": bool(trainer.args.use_liger_kernel),
        "steps": int(trainer.state.global_step),
        "fsdp_sharding_strategy_env": os.environ.get("FSDP_SHARDING_STRATEGY"),
    }


def _arguments(settings: Path, trainer: str) -> dict[str, Any]:
    """The Trainer's (or SFTConfig's) keywords: the chosen ones over the benchmark's."""
    chosen = _json(settings / ("sft_config.json" if trainer == "sft" else "training_arguments.json"))
    bench = settings / "benchmark_arguments.json"
    return {**(_json(bench) if bench.is_file() else {}), **chosen}


def _training_args(kind: str, kwargs: dict[str, Any]) -> Any:
    """``SFTConfig(**kwargs)`` (``sft``) or ``TrainingArguments(**kwargs)`` (``plain``)."""
    if kind == "sft":
        from trl import SFTConfig

        return SFTConfig(**kwargs)
    from transformers import TrainingArguments

    return TrainingArguments(**kwargs)


def _trainer(
    kind: str, args: Any, *, model: Any, entries: list[list[int]], run: RunSettings, callbacks: list[Any]
) -> Any:
    """The Trainer of ``kind`` (``plain`` or ``sft``) over ``entries``; with the CPU shim where the
    arguments put FSDP on the CPU."""
    if kind == "sft":
        from datasets import Dataset
        from trl import SFTTrainer

        base: Any = SFTTrainer
        extra = {
            "train_dataset": Dataset.from_dict({"input_ids": entries}),
            "processing_class": _tokenizer(model),
        }
    else:
        from transformers import Trainer

        base = Trainer
        extra = {"train_dataset": [{"input_ids": e} for e in entries], "data_collator": run.data_collator()}
    cls = type(f"{base.__name__}OnCpu", (FsdpOnCpu, base), {}) if args.use_cpu and args.fsdp else base
    return cls(model=model, args=args, callbacks=callbacks, **extra)


def _count_tokens(model: Any, log: Any) -> None:
    """Count each micro-batch fed to ``model`` into ``log``'s running totals, as the benchmark's
    ``CountingTrainer`` does: dataset tokens (the attention mask's sum; without a mask, every
    token: a packed batch), tokens with padding, entries."""

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or not module.training:
            return
        mask = kwargs.get("attention_mask")
        positions = kwargs.get("position_ids")
        log.run_dataset_tokens += int(mask.sum()) if mask is not None else ids.numel()
        log.run_train_tokens += ids.numel()
        if mask is None and positions is not None:  # packed: one row of entries, each from position 0
            log.run_samples += int(positions.eq(0).sum())
        else:
            log.run_samples += ids.shape[0]

    model.register_forward_pre_hook(hook, with_kwargs=True)


def _clock(job: dict[str, Any], device: Any) -> tuple[Any, Any, Any]:
    """(the job's measurement spec, the step log, the benchmark's step clock over it). The clock
    never stops the run (``--steps`` does): its rule is ``steps`` over more steps than any run."""
    from explorer.spec import MeasurementSpec
    from explorer.worker._timing import StepClock, StepLog

    spec = MeasurementSpec.model_validate(job.get("measurement") or {})
    never = MeasurementSpec(stop="steps", warmup_steps=spec.warmup_steps, measured_steps=10**9)
    log = StepLog()
    return spec, log, StepClock(log, device=device, spec=never)


def _window(spec: Any, log: Any) -> int:
    """The warmup steps the job's own stop rule gives on this run's clock (its warmup steps,
    extended past one-off spikes); the job's warmup steps where that leaves under 2 measured."""
    from explorer.worker._stopping import decide

    if not log.ends:
        return 0
    warmup = decide(spec, start=log.start or log.ends[0], ends=log.ends).warmup
    if len(log.ends) - warmup >= 2:
        return warmup
    return min(spec.warmup_steps, len(log.ends) - 1)


def measure(spec: Any, log: Any, *, device: Any, baseline_rss: int, cap_gib: float | None) -> dict[str, Any]:
    """This run's throughput and peak memory, the benchmark's way (see the module's docstring);
    collective: every rank calls it, and every rank gets the same figures."""
    from explorer.worker._memory import peak_memory_bytes
    from explorer.worker._stopping import relative_ci

    warmup = _window(spec, log)
    base = (log.dataset_tokens[warmup - 1], log.train_tokens[warmup - 1]) if warmup else (0, 0)
    ends = (log.dataset_tokens[-1], log.train_tokens[-1]) if log.ends else (0, 0)
    by_step = [b - a for a, b in zip([0, *log.dataset_tokens[:-1]], log.dataset_tokens, strict=True)]
    counts = [e - b for e, b in zip(ends, base, strict=True)] + by_step
    summed, peak, world = _over_ranks(counts, peak_memory_bytes(device, baseline_rss=baseline_rss)[0], device)
    begin = log.ends[warmup - 1] if warmup else log.start
    durations = [b - a for a, b in zip([begin, *log.ends[warmup:-1]], log.ends[warmup:], strict=True)]
    seconds = sum(durations)
    return {
        "warmup_steps": warmup,
        "measured_steps": len(durations),
        "measured_seconds": seconds,
        "measured_dataset_tokens": summed[0],
        "measured_train_tokens": summed[1],
        "processes": world,
        "dataset_tokens_per_second_per_gpu": summed[0] / seconds / world if seconds > 0 else None,
        "step_times": [round(d, 6) for d in durations],
        "dataset_tokens_by_step": summed[2:],  # every step's, warmup included, all ranks
        "step_time_rel_ci": relative_ci(durations) if len(durations) > 1 else None,
        "peak_memory_gib": peak / 2**30,
        "memory_cap_gib": cap_gib,
    }


def _over_ranks(counts: list[int], peak: float, device: Any) -> tuple[list[int], float, int]:
    """(``counts`` summed over the ranks, the largest ``peak``, the ranks)."""
    import torch
    import torch.distributed as dist

    summed = torch.tensor(counts, dtype=torch.float64)
    peaks = torch.tensor([float(peak)], dtype=torch.float64)
    if not dist.is_initialized():
        return [int(x) for x in summed.tolist()], float(peaks[0]), 1
    comm = "cuda" if device.type == "cuda" else "cpu"
    summed, peaks = summed.to(comm), peaks.to(comm)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    return [int(x) for x in summed.cpu().tolist()], float(peaks[0]), dist.get_world_size()


def _write_facts(out: Path, record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"facts-rank{record['rank']}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Train one rank; writes ``facts-rank<r>.json``. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m explorer.user_train", description=__doc__.split("\n")[0])
    parser.add_argument("--settings", required=True, metavar="DIR", help="the folder `explorer best` wrote")
    parser.add_argument(
        "--trainer", choices=("plain", "sft"), default="plain", help="Trainer or TRL's SFTTrainer"
    )
    parser.add_argument("--steps", type=int, default=3, metavar="N", help="optimizer steps (max_steps)")
    parser.add_argument(
        "--out", metavar="DIR", help="folder for facts-rank<r>.json (default: user-run/ beside)"
    )
    parser.add_argument(
        "--data", metavar="FILE.jsonl", help='entries {"input_ids": [...]} (default: synthetic)'
    )
    parser.add_argument(
        "--memory-cap-gib",
        type=float,
        metavar="GIB",
        help="the study's device_memory_gib per process, enforced as its trials ran (the CPU: RLIMIT_AS)",
    )
    ns = parser.parse_args(argv)
    if ns.memory_cap_gib is not None and ns.memory_cap_gib <= 0:
        parser.error(f"--memory-cap-gib {ns.memory_cap_gib} must be above 0")
    settings = Path(ns.settings)
    out = Path(ns.out) if ns.out else settings / "user-run"
    try:
        run = RunSettings.load(settings / "run_settings.json")
        job = _json(settings / "job.json")
        kwargs = _arguments(settings, ns.trainer)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kwargs.update(output_dir=str(out / "trainer"), max_steps=ns.steps)
    early = run.apply_environment()  # before the arguments: accelerate reads FSDP1's strategy
    args = _training_args(ns.trainer, kwargs)
    spec, log, clock = _clock(job, args.device)  # args.device: the process group first, as in a trial
    _preload(ns.trainer, run)
    entries = _entries(ns.data, n=64, max_length=run.model_max_length, vocab_size=_vocab_size(job))
    cap = _memory_cap(ns.memory_cap_gib, args.device)  # from here on, the model and its training count
    model = _model(job, run)
    prepared = run.prepare_model(model)  # before the Trainer: environment, some layers checkpointed
    prepared["environment"] = {**early, **prepared["environment"]}
    layers = _Counter(decoder_layers(model))
    embedding = _Counter([model.get_input_embeddings()], children=False)
    _count_tokens(model, log)
    trainer = _trainer(ns.trainer, args, model=model, entries=entries, run=run, callbacks=[clock])
    first = _FirstBatch(trainer.data_collator)
    trainer.data_collator = first
    try:
        cap.enforce()
        trainer.train()
    except Exception as exc:  # the facts as far as they go (a batch drawn, untrained), then the error
        cap.release()
        next(iter(trainer.get_train_dataloader()))
        record = {**facts(trainer, layers=layers, embedding=embedding, first=first), "prepared": prepared}
        _write_facts(out, {**record, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"})
        raise
    cap.release()
    figures = measure(spec, log, device=args.device, baseline_rss=cap.baseline_rss, cap_gib=ns.memory_cap_gib)
    record = {**facts(trainer, layers=layers, embedding=embedding, first=first), "prepared": prepared}
    _write_facts(out, {**record, "measurement": figures})
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _preload(kind: str, run: RunSettings) -> None:
    """Import the libraries the run takes before the memory baseline, as a trial's worker has
    them (imports are the interpreter's, not the model's memory)."""
    import transformers  # noqa: F401

    if kind == "sft":
        import datasets  # noqa: F401
        import trl  # noqa: F401
    run.peft_config()  # peft, for a LoRA configuration


def _vocab_size(job: dict[str, Any]) -> int:
    """The vocabulary of ``job.json``'s model, from its configuration alone."""
    from transformers import AutoConfig

    spec = job["workload"]["model"]
    if spec.get("architecture"):
        arch = dict(spec["architecture"])
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    else:
        config = AutoConfig.from_pretrained(job.get("model_path") or spec["path"])
    return int(config.get_text_config().vocab_size)


def _memory_cap(cap_gib: float | None, device: Any) -> Any:
    """The study's memory cap (``None``: none), its baseline marked now: after the process group,
    before the model (:class:`explorer.worker._memory.MemoryCap`, as a trial takes it)."""
    from explorer.worker._memory import MemoryCap

    cap = MemoryCap(int(cap_gib * 2**30) if cap_gib else None, device)
    cap.mark_baseline()
    return cap


if __name__ == "__main__":
    sys.exit(main())
