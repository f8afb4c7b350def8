"""``explorer best``: write the best feasible configuration as files, and say how to run it."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.best._render import (
    UserFiles,
    accelerate_command,
    nodes_note,
    render_user_files,
    torchrun_command,
)
from explorer.best._select import Selection
from explorer.job import TrialJob
from explorer.record import TrialRecord
from explorer.study import config_of, describe
from explorer.study._objectives import objective_value

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy
    from explorer.trial_config import TrialConfig

__all__ = [
    "FILES",
    "OUTPUTS",
    "BestFiles",
    "device_type_of",
    "launch_script",
    "split_arguments",
    "summary_lines",
    "write_best",
    "write_config",
]


FILES = (
    "accelerate.yaml",
    "training_arguments.json",
    "benchmark_arguments.json",
    "job.json",
    "launch.sh",
    "sft_config.json",
    "run_settings.json",
)
"""The set of files :func:`write_config` writes, replaced as one (:func:`explorer.paths.write_set`)."""

OUTPUTS = ("run", "user-run")
"""What the printed commands write beside the files (the check run's ``run/``,
``explorer.user_train``'s ``user-run/``): kept when the set is written again."""


@dataclass(frozen=True)
class BestFiles:
    """What :func:`write_best` wrote, and the command lines that run it."""

    accelerate_config: Path
    training_arguments: Path
    """What the study chose (and the study file's own TrainingArguments): for the real run."""
    benchmark_arguments: Path
    """What only the benchmark sets (learning rate, no saving or logging, ...): not choices."""
    job: Path
    launch_script: Path
    torchrun: str
    accelerate: str
    user: UserFiles | None = None
    """sft_config.json, run_settings.json and a user's script's commands."""


def device_type_of(loaded: LoadedStudy, trial: optuna.trial.FrozenTrial | None) -> str:
    """``cuda`` or ``cpu``: where the trial was measured (its ``device`` property), else (or with
    no trial: a configuration never measured) where the study's resources say (``auto`` taken as
    CUDA)."""
    measured = TrialRecord.of(trial).device if trial is not None else None
    if measured in ("cuda", "cpu"):
        return str(measured)
    return "cpu" if loaded.spec.resources.device == "cpu" else "cuda"


def _layer_classes(loaded: LoadedStudy, job: TrialJob) -> list[str] | None:
    """The decoder layer classes FSDP wraps, as the worker finds them (FSDP only)."""
    if job.config.distributed_backend != "FSDP":
        return None
    from explorer.worker._model import decoder_layer_classes, load_config

    return decoder_layer_classes(load_config(job.workload.model, job.model_path))


def write_best(
    loaded: LoadedStudy, selection: Selection, out_dir: Path, *, steps: int, claim: bool = False
) -> BestFiles:
    """Write the accelerate config, the Trainer's arguments, the job and a launch script.

    Args:
        loaded: The study.
        selection: Its best trial and runners-up.
        out_dir: Folder for the files (created).
        steps: Measured steps the printed commands train for (after the study's warmup steps).

    Returns:
        The paths written and the two command lines.
    """
    best = selection.best
    return write_config(
        loaded,
        config_of(best),
        out_dir,
        steps=steps,
        trial_number=best.number,
        device_type=device_type_of(loaded, best),
        title=f"The best configuration of study {loaded.spec.name!r}: trial {best.number}, "
        f"{objective_value(best):.1f} dataset tokens/s per GPU.",
        claim=claim,
    )


def write_config(
    loaded: LoadedStudy,
    config: TrialConfig,
    out_dir: Path,
    *,
    steps: int,
    trial_number: int,
    device_type: str,
    title: str,
    claim: bool = False,
) -> BestFiles:
    """:func:`write_best` for any configuration of the study (``explorer plan``'s choice, which
    may hold more GPUs than any trial did); ``title`` heads each file. The files are written as
    one set (:func:`explorer.paths.write_set`): a kill or a reader finds the old set or the new
    one whole, and a folder that holds files of the user's is refused. With ``claim`` (a folder
    the user gave, ``--out``), no file explorer did not write there is overwritten either."""
    from explorer.paths import inside, write_set

    job = TrialJob.for_study(loaded, config, trial_number=trial_number)
    files = {name: out_dir / name for name in FILES}
    inside(out_dir, files.values(), file=str(loaded.file))
    best, texts = _render(
        job, files, steps=steps, device_type=device_type, title=title, layers=_layer_classes(loaded, job)
    )
    write_set(
        out_dir,
        texts,
        keep=OUTPUTS,
        executable=("launch.sh",),
        claim=claim,
        file="--out" if claim else str(loaded.file),
        field="" if claim else "output_dir",
    )
    return best


def _render(
    job: TrialJob,
    files: dict[str, Path],
    *,
    steps: int,
    device_type: str,
    title: str,
    layers: list[str] | None,
) -> tuple[BestFiles, dict[str, str]]:
    """The files' paths and commands, and their texts by name; the texts name ``files``, the
    paths the files will have (not where they are written first)."""
    from explorer.settings import launch_settings

    header = (
        title,
        f"Written by `explorer best`; run: accelerate launch --config_file {shlex.quote(str(files['accelerate.yaml']))} ...",
    )
    settings = launch_settings(job, device_type=device_type, layer_classes=layers, header=header)
    chosen, benchmark = split_arguments(job, settings.training_arguments)
    torchrun = torchrun_command(job.config, job_file=files["job.json"], steps=steps)
    accelerate = accelerate_command(
        config_file=files["accelerate.yaml"], job_file=files["job.json"], steps=steps, config=job.config
    )
    user, user_texts = render_user_files(
        files["job.json"].parent,
        job.config,
        settings,
        sft_config=split_arguments(job, settings.sft_config)[0],
    )
    texts = {
        "accelerate.yaml": settings.accelerate,
        "training_arguments.json": json.dumps(chosen, indent=2) + "\n",
        "benchmark_arguments.json": json.dumps(benchmark, indent=2) + "\n",
        "job.json": json.dumps(json.loads(job.to_json()), indent=2) + "\n",
        "launch.sh": launch_script(header[0], job.config, torchrun=torchrun, accelerate=accelerate),
        **user_texts,
    }
    best = BestFiles(
        accelerate_config=files["accelerate.yaml"],
        training_arguments=files["training_arguments.json"],
        benchmark_arguments=files["benchmark_arguments.json"],
        job=files["job.json"],
        launch_script=files["launch.sh"],
        torchrun=torchrun,
        accelerate=accelerate,
        user=user,
    )
    return best, texts


def split_arguments(job: TrialJob, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``kwargs`` (the trial's TrainingArguments) as (chosen, benchmark-only): what the study chose
    or the study file set (``workload.training_arguments``), and what only the benchmark sets
    (:data:`~explorer.worker._train.BENCHMARK_ONLY`: learning rate, no saving or logging, ...)."""
    from explorer.worker._train import BENCHMARK_ONLY

    own = job.workload.training_arguments
    benchmark = {k: v for k, v in kwargs.items() if k in BENCHMARK_ONLY and k not in own}
    return {k: v for k, v in kwargs.items() if k not in benchmark}, benchmark


def launch_script(title: str, config: TrialConfig, *, torchrun: str, accelerate: str) -> str:
    """``launch.sh``: a check run of the configuration, not the fine-tune itself."""
    lines = [
        "#!/bin/sh",
        f"# {title}",
        "# A check run: the benchmark's worker trains this configuration on the study's model and data",
        "# for the job's warmup steps and --steps more (with the worst-case step and the memory cap),",
        "# and prints its throughput and peak memory: it shows the configuration runs here. It saves",
        "# nothing; your fine-tune takes training_arguments.json (benchmark_arguments.json holds what",
        "# only the benchmark sets) and accelerate.yaml.",
        *([f"# {note}"] if (note := nodes_note(config)) else []),
        f"# or: {accelerate}",
        f"exec {torchrun}",
    ]
    return "\n".join(lines) + "\n"


def outside_training_arguments(config: TrialConfig) -> list[str]:
    """The knobs of ``config`` that are no ``TrainingArguments`` field of their own (the model, the
    data, what the worker applies itself), where they are not at their default: the written files
    carry them (run_settings.json: :class:`explorer.settings.RunSettings`), and a script of your
    own applies them as ``explorer.user_train`` does."""
    from explorer.knobs import knobs

    settings = [
        f"{k.name}={getattr(config, k.name)}"
        for k in knobs()
        if k.training_args is None
        and k.default is not None
        and k.applies(config.to_dict(), {"method": None})
        and getattr(config, k.name) != k.default
    ]
    if not settings:
        return []
    return [
        f"  not a TrainingArguments field of their own (the files below carry them; your script applies "
        f"run_settings.json as explorer.user_train does): {', '.join(settings)}"
    ]


def _attr(trial: optuna.trial.FrozenTrial, key: str) -> float:
    value: Any = TrialRecord.of(trial).get(key)
    return float(value) if isinstance(value, int | float) else float("nan")


def _memory_text(trial: optuna.trial.FrozenTrial, cap_gib: float | None) -> str:
    """``0.304 GiB of 0.500 (headroom 39.2%)``, as far as the trial stored it."""
    from explorer.measurement import memory_headroom
    from explorer.report import trial_memory

    peak, limit = trial_memory(trial, cap_gib)
    text = f"{peak:.3f} GiB" if peak is not None else "- GiB"
    if peak is None or limit is None:
        return text
    return f"{text} of {limit:.3f} (headroom {100 * (memory_headroom(peak, limit) or 0.0):.1f}%)"


def summary_lines(loaded: LoadedStudy, selection: Selection, files: BestFiles) -> list[str]:
    """What ``explorer best`` prints: the best trial's figures, the runners-up, paths, commands."""
    best = selection.best
    config = config_of(best)
    value = objective_value(best) or 0.0
    named = "leading (not confirmed)" if selection.unconfirmed else "best"
    lines = [
        f"{named}: trial {best.number} of study {loaded.spec.name!r}: {describe(config)}",
        *(f"  {line}" for line in selection.verdict),
        f"  {value:.1f} dataset tok/s/gpu, {_attr(best, 'dataset_tokens_per_second'):.1f} total "
        f"on {config.number_gpus} GPU(s); MFU {100 * _attr(best, 'mfu'):.2f}%; "
        f"peak memory {_memory_text(best, loaded.spec.resources.device_memory_gib)}",
        *(selection.memory.lines() if selection.memory is not None else []),
        f"within noise (at most {100 * selection.tolerance:.1f}% below the best: the larger of 2% and "
        f"its step-time CI over {int(_attr(best, 'measured_steps'))} steps):",
    ]
    if selection.runners_up:
        lines.append(f"  {'trial':<6} {'tok/s/gpu':>10} {'vs best':>8}  configuration")
        for t in selection.runners_up:
            ratio = (objective_value(t) or 0.0) / value - 1.0 if value else 0.0
            lines.append(
                f"  {t.number:<6} {objective_value(t) or 0.0:>10.1f} {100 * ratio:>+7.1f}%  {describe(config_of(t))}"
            )
    else:
        lines.append("  none")
    lines += [
        f"accelerate config:  {files.accelerate_config}",
        f"training arguments: {files.training_arguments} (chosen; benchmark-only settings apart: "
        f"{files.benchmark_arguments.name})",
        *outside_training_arguments(config),
        *(files.user.paths() if files.user is not None else []),
        f"job:                {files.job}",
        f"launch script:      {files.launch_script}",
        "check that it runs here (a short benchmark run; it saves nothing):",
        *(f"  {note}" for note in [nodes_note(config)] if note),
        f"  {files.torchrun}",
        f"  {files.accelerate}",
        *(files.user.commands() if files.user is not None else []),
    ]
    return lines
