"""``explorer verify``: launch a trial's written files the way a user would, and compare with the study.

The files are ``explorer best``'s (:func:`explorer.best.write_config`): by default written afresh
for the trial into ``<output_dir>/verify/trial-N/files``; with ``--files DIR`` the folder given
(``<output_dir>/best``, or a copy you edited), compared field by field with the trial's own. The
launch is the user command ``run_settings.json`` holds (``torchrun ... -m explorer.user_train``,
a stock ``Trainer`` that reads only the files, the study's model and the data; real processes,
gloo on the CPU), pointed at that folder, with ``--steps`` measured steps after the job's warmup,
the study's data written as token ids (``data.jsonl``: the same entries, so the same batches and
tokens as the trial's) and the study's ``device_memory_gib`` per process (the cap its trials ran
under: on the CPU ``RLIMIT_AS``, so that out-of-memory behaves the same). On the CPU the launch
also gets the threads per process the trials had.

Its throughput (dataset tokens per second per process, after the warmup, without padding) and peak
memory are printed beside the trial's, with the ratio and the noise: the trial's step-time interval
plus the launch's own, at least :data:`explorer.report.MIN_TOLERANCE`. Exit 0 within the noise;
exit 1 when the launch runs out of memory, fails, lands outside the noise, or runs files that
differ from the trial's, with the likely cause.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError

if TYPE_CHECKING:
    import optuna

    from explorer.job import TrialJob
    from explorer.spec import LoadedStudy

__all__ = [
    "Launch",
    "Verdict",
    "file_differences",
    "judge",
    "launch_command",
    "verify",
    "write_study_data",
]

COMPARED = ("training_arguments.json", "benchmark_arguments.json", "run_settings.json", "job.json")
"""The written files whose every field is compared with the trial's (``run_settings.json`` without
its commands and notes, ``job.json`` without the trial's number and paths)."""
_NOT_COMPARED = frozenset({"commands", "how", "trial_number", "model_path", "dataset_path"})


@dataclass(frozen=True)
class Launch:
    """What the user command did: its exit status, output, and each rank's facts."""

    returncode: int | None
    """``None``: killed at the timeout."""
    output: str
    facts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def measurement(self) -> dict[str, Any] | None:
        """Rank 0's figures (every rank holds the same), ``None`` when the run did not finish."""
        first = next((f for f in self.facts if f.get("rank") == 0), None)
        return first.get("measurement") if first else None

    @property
    def error(self) -> str | None:
        """The first rank's error, else the output's last line when the command failed."""
        errors = [f["error"] for f in self.facts if f.get("error")]
        if errors:
            return str(errors[0])
        if self.returncode == 0:
            return None
        if self.returncode is None:
            return "did not finish before the timeout"
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1].strip() if lines else f"exit status {self.returncode}"


@dataclass(frozen=True)
class Verdict:
    """The comparison: the line, the exit status and the likely cause."""

    line: str
    ok: bool
    causes: list[str]


def file_differences(reference: Path, files: Path) -> list[str]:
    """Each field of :data:`COMPARED` whose value in ``files`` is not the trial's (``reference``):
    ``training_arguments.json: per_device_train_batch_size 8 (the trial's: 4)``."""
    out: list[str] = []
    for name in COMPARED:
        mine = _flat(_read_json(files / name))
        theirs = _flat(_read_json(reference / name))
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key, "-") != theirs.get(key, "-"):
                out.append(
                    f"{name}: {key} {_shown(mine.get(key, '-'))} (the trial's: {_shown(theirs.get(key, '-'))})"
                )
    return out


def _shown(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(file=str(path), field="", problem=f"cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(file=str(path), field="", problem="not a JSON object")
    return data


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"config.batch_size": 8, ...}``: nested objects as dotted keys."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not prefix and key in _NOT_COMPARED:
            continue
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def write_study_data(job: TrialJob, path: Path) -> int:
    """The study's training data as ``{"input_ids": [...]}`` lines, the entries the trial's worker
    trains on (synthetic, or the JSONL file through the model's tokenizer; repeated to a full
    batch where fewer): the same dataset, so the same batches. Returns the entries written."""
    from explorer.worker._model import load_config
    from explorer.worker._train import training_dataset

    vocab = load_config(job.workload.model, job.model_path).get_text_config().vocab_size
    data = training_dataset(job, vocab_size=vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(len(data)):
            item = data[i]
            ids = item["input_ids"][: int(item["attention_mask"].sum())]
            fh.write(json.dumps({"input_ids": ids.tolist()}) + "\n")
    return len(data)


def launch_command(files: Path, which: str, *, extra: list[str]) -> str:
    """The user command ``files/run_settings.json`` holds for ``which`` (``torchrun``,
    ``accelerate``, ``sft``), pointed at ``files`` (the folder may have moved since it was
    written), with ``extra`` arguments for the script."""
    commands = _read_json(files / "run_settings.json").get("commands")
    if not isinstance(commands, dict) or not isinstance(commands.get(which), str):
        raise SpecError(file=str(files / "run_settings.json"), field=f"commands.{which}", problem="missing")
    words = shlex.split(commands[which])
    for flag, target in (("--settings", files), ("--config_file", files / "accelerate.yaml")):
        if flag in words[:-1]:
            words[words.index(flag) + 1] = str(target)
    return shlex.join([*words, *extra])


def _environment(job: TrialJob) -> dict[str, str]:
    """This shell's environment for the launch, with this Python's scripts first on ``PATH``,
    without inherited FSDP/accelerate variables (the written command sets what it needs); on the
    CPU the trials' threads per process (:func:`explorer.launch.trial_environment`)."""
    from explorer.launch import trial_environment

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_", "ACCELERATE_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if job.resources.device == "cpu":
        trial = trial_environment(job, cpu_count=os.cpu_count() or 1, base={})
        env.update({k: trial[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_ARENA_MAX")})
    return env


def run_launch(command: str, *, env: dict[str, str], out: Path, timeout_s: float) -> Launch:
    """Run ``command`` (in a session of its own, killed whole at the timeout); read the facts."""
    for old in out.glob("facts-rank*.json"):
        old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["bash", "-c", command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = None
    (out / "launch.log").write_text(output)
    facts = [json.loads(p.read_text()) for p in sorted(out.glob("facts-rank*.json"))]
    return Launch(returncode=code, output=output, facts=facts)


@dataclass(frozen=True)
class Study:
    """The trial's figures, as the study stored them."""

    number: int
    tokens_per_gpu: float
    rel_ci: float | None
    """The trial's step-time interval (``None``: unknown, fewer than 2 measured steps)."""
    peak_gib: float | None
    cap_gib: float | None
    measured_steps: int | None = None


def judge(study: Study, launch: Launch, *, differences: list[str], load: str | None = None) -> Verdict:
    """Compare ``launch`` with the trial: the line, whether it passes, and the likely causes.

    It passes when it finished, within the memory cap, inside the noise (the trial's step-time
    interval plus the launch's, at least :data:`~explorer.report.MIN_TOLERANCE`), on files that
    are the trial's. ``load``: the machine's load, named where the noise is wide or it is slower.
    """
    from explorer.report import MIN_TOLERANCE

    head = f"verify: trial {study.number}:"
    m = launch.measurement
    error = launch.error
    cap = study.cap_gib
    files = [f"the files differ from trial {study.number}'s: {d}" for d in differences]
    if m is None or error is not None or not m.get("dataset_tokens_per_second_per_gpu"):
        return _failed(head, study, error or "measured no step after the warmup", files)
    mine = float(m["dataset_tokens_per_second_per_gpu"])
    ratio = mine / study.tokens_per_gpu
    launch_ci = m.get("step_time_rel_ci")
    tolerance = max(MIN_TOLERANCE, (study.rel_ci or 0.0) + (launch_ci or 0.0))
    within = abs(ratio - 1.0) <= tolerance
    peak = float(m["peak_memory_gib"])
    line = (
        f"{head} {mine:,.0f} tok/s/GPU in your launch vs {study.tokens_per_gpu:,.0f} in the study "
        f"(x{ratio:.2f}, {'within' if within else 'outside'} the noise +-{100 * tolerance:.1f}%: "
        f"the trial's {_ci(study.rel_ci)} plus your launch's {_ci(launch_ci)}); "
        f"peak {peak:.2f} GiB vs {_gib(study.peak_gib)}"
    )
    if cap is not None and peak > cap:  # the worker's rule: a peak over the limit did not fit
        return Verdict(
            line, False, [f"out of memory: the peak exceeds the study's cap of {cap:g} GiB", *files]
        )
    causes = list(files)
    if not within:
        causes += _noise_causes(study, m, ratio, load) if not files else []
    return Verdict(line, within and not files, causes)


def _ci(value: float | None) -> str:
    return f"+-{100 * value:.1f}%" if value is not None else "unknown"


def _gib(value: float | None) -> str:
    return f"{value:.2f} GiB" if value is not None else "- (not stored)"


def _failed(head: str, study: Study, error: str, files: list[str]) -> Verdict:
    from explorer.oom import mentions_oom

    if mentions_oom(error):
        cap = f" under the study's cap of {study.cap_gib:g} GiB per process" if study.cap_gib else ""
        line = (
            f"{head} out of memory in your launch{cap} (the trial peaked at {_gib(study.peak_gib)}): {error}"
        )
        cause = files or ["the launch holds more memory than the trial's worker did (the same files)"]
        return Verdict(line, False, cause)
    return Verdict(f"{head} your launch failed: {error}", False, files)


def _noise_causes(study: Study, m: dict[str, Any], ratio: float, load: str | None) -> list[str]:
    """Why the same files may measure apart: a wide interval (a busy machine), else the launch."""
    wide = [
        f"{who}'s step times vary +-{100 * ci:.1f}%"
        for who, ci in (("the trial", study.rel_ci), ("your launch", m.get("step_time_rel_ci")))
        if ci is not None and ci > 0.05
    ]
    busy = f" ({load})" if load else ""
    if study.rel_ci is None:
        steps = f"{study.measured_steps} step" if study.measured_steps is not None else "too few steps"
        return [
            f"the trial's own noise is unknown: it measured {steps} (the study's measurement window "
            f"too short for this machine?{'; ' + load if load else ''}); a trial measured over more "
            "steps gives an interval"
        ]
    if wide:
        return [f"a busy machine: {'; '.join(wide)}{busy}; run verify again when it is quiet"]
    side = "slower" if ratio < 1 else "faster"
    return [
        f"the same files run {side} outside the benchmark's worker{busy}: another machine or other "
        "software than the trial's, or other processes on it"
    ]


def _load() -> str | None:
    """``load average 3.1 on 2 CPUs`` (``None`` where the system has none)."""
    try:
        one = os.getloadavg()[0]
    except OSError:
        return None
    return f"load average {one:.1f} on {os.cpu_count() or 1} CPUs"


def pick_trial(
    loaded: LoadedStudy, study: optuna.Study, number: int | None, *, file: str
) -> optuna.trial.FrozenTrial:
    """Trial ``number`` (measured, status ok), else the study's best (:func:`explorer.best.select_best`)."""
    from explorer.best import select_best
    from explorer.report import feasible_ranking

    if number is None:
        spec = loaded.spec
        selection = select_best(
            study,
            margin=spec.memory_margin,
            cap_gib=spec.resources.device_memory_gib,
            space=loaded.space,
            file=file,
        )
        if selection is None:
            raise SpecError(
                file=file, field="", problem=f"no feasible trial in study {spec.name!r}; nothing to verify"
            )
        return selection.best
    found = next((t for t in feasible_ranking(study) if t.number == number), None)
    if found is None:
        raise SpecError(
            file="--trial", field="", problem=f"trial {number} is no measured feasible trial of the study"
        )
    return found


def _files_trial(files: Path) -> int | None:
    """The trial ``files/job.json`` was written for (``None``: none named)."""
    number = _read_json(files / "job.json").get("trial_number")
    return int(number) if isinstance(number, int) and number >= 0 else None


def _study_figures(loaded: LoadedStudy, trial: optuna.trial.FrozenTrial) -> Study:
    from explorer.record import TrialRecord
    from explorer.report import trial_memory
    from explorer.study._objectives import objective_value

    cap = loaded.spec.resources.device_memory_gib
    peak, _ = trial_memory(trial, cap)
    return Study(
        number=trial.number,
        tokens_per_gpu=float(objective_value(trial) or 0.0),
        rel_ci=TrialRecord.of(trial).step_time_rel_ci,
        peak_gib=peak,
        cap_gib=cap,
        measured_steps=steps
        if isinstance(steps := TrialRecord.of(trial).get("measured_steps"), int)
        else None,
    )


def verify(
    loaded: LoadedStudy,
    study: optuna.Study,
    *,
    trial: int | None,
    steps: int,
    files: Path | None,
    which: str = "torchrun",
    timeout_s: float,
    file: str,
    echo: Callable[[str], None] = print,
) -> int:
    """Write (or take) the trial's files, launch them, print the comparison; the exit status."""
    from explorer.study import config_of, describe

    if files is not None:  # one line, nothing written, where a file is missing or no JSON object
        for name in COMPARED:
            _read_json(files / name)
        trial = trial if trial is not None else _files_trial(files)
    chosen = pick_trial(loaded, study, trial, file=file)
    if int(config_of(chosen).number_nodes or 1) > 1:
        raise SpecError(
            file=file,
            field="",
            problem=f"trial {chosen.number} ran on {config_of(chosen).number_nodes} nodes; "
            "verify launches on this one",
        )
    folder = loaded.output_dir / "verify" / f"trial-{chosen.number}"
    job, reference, entries = _write_trial(loaded, chosen, folder, steps=steps)
    target = files if files is not None else reference
    differences = file_differences(reference, target) if files is not None else []
    cap = loaded.spec.resources.device_memory_gib
    extra = ["--steps", str(job.measurement.warmup_steps + steps), "--out", str(folder / "run")]
    extra += ["--data", str(folder / "data.jsonl"), *(["--memory-cap-gib", str(cap)] if cap else [])]
    command = launch_command(target, which, extra=extra)
    env = _environment(job)
    echo(f"trial {chosen.number}: {describe(job.config)}")
    written = " (written for the trial)" if files is None else ""
    echo(f"files: {target}{written}; data: {entries} entries of the study's")
    echo(f"memory: {_cap_text(cap, job)}; threads per process: {env.get('OMP_NUM_THREADS', 'as this shell')}")
    echo(f"launch: {command}")
    done = run_launch(command, env=env, out=folder / "run", timeout_s=timeout_s)
    verdict = judge(_study_figures(loaded, chosen), done, differences=differences, load=_load())
    echo(verdict.line)
    for cause in verdict.causes:
        echo(f"  likely cause: {cause}")
    if not verdict.ok and done.returncode != 0:
        echo(f"  the launch's output: {folder / 'run' / 'launch.log'}")
    return 0 if verdict.ok else 1


def _write_trial(
    loaded: LoadedStudy, trial: optuna.trial.FrozenTrial, folder: Path, *, steps: int
) -> tuple[TrialJob, Path, int]:
    """(the trial's job, its files written with ``explorer best``'s writer into ``folder/files``,
    the entries of the study's data written into ``folder/data.jsonl``)."""
    from explorer.best import device_type_of, write_config
    from explorer.job import TrialJob
    from explorer.study import config_of

    config = config_of(trial)
    write_config(
        loaded,
        config,
        folder / "files",
        steps=steps,
        trial_number=trial.number,
        device_type=device_type_of(loaded, trial),
        title=f"Trial {trial.number} of study {loaded.spec.name!r}, as `explorer verify` launches it.",
    )
    job = TrialJob.for_study(loaded, config, trial_number=trial.number)
    return job, folder / "files", write_study_data(job, folder / "data.jsonl")


def _cap_text(cap: float | None, job: TrialJob) -> str:
    if cap is None:
        return "no cap (the study sets no device_memory_gib)"
    how = "RLIMIT_AS on the CPU" if job.resources.device == "cpu" else "the per-process memory fraction"
    return f"the study's cap of {cap:g} GiB per process ({how}), as its trials ran"
