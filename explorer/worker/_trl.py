"""One rank's trainer under ``workload.trainer: trl``: TRL's ``SFTTrainer`` with the configuration's
``SFTConfig`` (:func:`explorer.settings.sft_config_kwargs`), the JSONL data through TRL's own
preparation, and the benchmark's token counting.

Each JSONL entry gives TRL its text field (as ``text``: TRL appends the EOS token to the text,
then tokenises it; a tokenizer that adds an EOS of its own, such as ``studies/local-model``'s,
then ends each entry in two) or, where the entry has no such field, its chat ``messages`` (TRL applies the tokenizer's
chat template). TRL truncates every entry to ``max_length`` when it pads; padding-free
(``padding: packed``) it enforces no ``max_length`` and refuses one, so the worker truncates the
prepared entries to ``model_max_length`` itself, as TRL's own truncation does. Either way an entry
counts ``min(len, model_max_length)`` dataset tokens: the tokens of the batches the trainer sees,
padding never counted (:class:`explorer.worker._timing.TokenCounting`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from explorer.job import TrialJob
from explorer.settings import FsdpOnCpu, fsdp_environment, sft_config_kwargs, training_kwargs

__all__ = ["TEXT", "jsonl_rows", "sft_arguments", "sft_trainer", "trainer_record", "truncated"]

TEXT = "text"
"""The column TRL reads the text from (``SFTConfig.dataset_text_field``)."""


def sft_arguments(
    job: TrialJob, *, device_type: str, output_dir: str, layer_classes: list[str] | None
) -> Any:
    """The ``SFTConfig`` of ``job.config``: the one mapping's keywords (Liger through
    ``use_liger_kernel``, as TRL applies it), the benchmark's step budget and text column."""
    from trl import SFTConfig

    os.environ.update(fsdp_environment(job.config))
    training = training_kwargs(job, device_type=device_type, layer_classes=layer_classes)
    kwargs = sft_config_kwargs(job.config, training)
    return SFTConfig(
        output_dir=output_dir, max_steps=job.measurement.step_budget, dataset_text_field=TEXT, **kwargs
    )


def jsonl_rows(path: Path, *, text_field: str) -> list[dict[str, Any]]:
    """The JSONL file's entries, in file order, as TRL's rows: ``{"text": ...}`` from
    ``text_field``, or ``{"messages": [...]}`` where the first entry has no ``text_field`` but
    chat messages (then every entry must have them).

    Raises:
        ValueError: an entry without the field (``file:line: ...``), or no entries.
    """
    rows: list[dict[str, Any]] = []
    key: str | None = None
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if key is None:
                chat = text_field not in record and isinstance(record.get("messages"), list)
                key = "messages" if chat else text_field
            if key not in record:
                raise ValueError(f"{path}:{lineno}: no field {key!r}")
            rows.append({"messages": record[key]} if key == "messages" else {TEXT: record[key]})
    if not rows:
        raise ValueError(f"{path}: no entries")
    return rows


def _filled(rows: list[dict[str, Any]], samples_per_step: int) -> list[dict[str, Any]]:
    """``rows`` repeated to at least ``samples_per_step`` (every step a full batch), as the
    transformers path's :func:`explorer.worker._data.filled`."""
    if len(rows) >= samples_per_step:
        return rows
    return (rows * math.ceil(samples_per_step / len(rows)))[:samples_per_step]


def truncated(dataset: Any, max_length: int) -> Any:
    """TRL's prepared ``dataset`` with every entry's ``input_ids`` and ``labels`` cut at
    ``max_length`` (TRL's own ``keep_start`` truncation, which it skips padding-free)."""

    def cut(example: dict[str, Any]) -> dict[str, Any]:
        return {k: example[k][:max_length] for k in ("input_ids", "labels") if k in example}

    return dataset.map(cut)


def sft_trainer(job: TrialJob, *, model: Any, args: Any, callbacks: list[Any], tokenizer: Any) -> Any:
    """TRL's ``SFTTrainer`` (counting tokens; FSDP on the CPU through the shim) over the study's
    JSONL file, prepared by TRL."""
    import datasets
    from trl import SFTTrainer

    from explorer.worker._timing import TokenCounting

    datasets.disable_progress_bars()
    rows = jsonl_rows(Path(job.dataset_path or ""), text_field=job.workload.dataset.text_field)
    data = datasets.Dataset.from_list(_filled(rows, job.config.global_batch))
    cls = type("CountingSFTTrainer", (TokenCounting, FsdpOnCpu, SFTTrainer), {})
    trainer = cls(model=model, args=args, train_dataset=data, processing_class=tokenizer, callbacks=callbacks)
    if args.padding_free and args.max_length is None:
        trainer.train_dataset = truncated(trainer.train_dataset, int(job.config.model_max_length))
    return trainer


def trainer_record(trainer: Any) -> dict[str, Any]:
    """The trainer that measured (``name``, ``version``, ``class``) and, under TRL, how its
    batches were made (``padding_free``, ``packing``, ``max_length``, ``pad_to_multiple_of``)."""
    from importlib.metadata import version

    is_trl = hasattr(trainer.args, "padding_free")
    name = "trl" if is_trl else "transformers"
    base = next(c for c in type(trainer).__mro__ if c.__module__.startswith(("trl.", "transformers.")))
    record: dict[str, Any] = {"name": name, "version": version(name), "class": base.__name__}
    if is_trl:
        a = trainer.args
        record.update(
            padding_free=bool(a.padding_free),
            packing=bool(a.packing),
            max_length=a.max_length,
            pad_to_multiple_of=a.pad_to_multiple_of,
        )
    return record
