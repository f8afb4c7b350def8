"""The replay launcher: answers trials from a recorded table instead of running them.

The table is a CSV in the layout of ado's ``ado show entities --output-format csv`` (a column per
entity-space parameter, a column per measured property, and ``is_valid``), which is also what an
explorer export writes. Rows are selected by the properties the study holds fixed (``model_name``,
``gpu_model``, ``method`` where the table has such a column); the configuration fields, the
sequence length among them, are matched against each trial's configuration.

* A row with ``is_valid`` 0 is infeasible: the trial is OOM, as if it had run out of memory.
* A configuration with several rows is answered from the median throughput of its valid rows
  (OOM when none is valid).
* A configuration absent from the table is FAILED with a message that says so; it is never
  given a value.
* Rows of an explorer export that measured nothing (``status`` failed, interrupted, retry) or
  copy another row (``reused_from``) are skipped. Parameters the table has no column for must be fixed by the study (checked when
  the study is loaded), and are then taken as what the table was measured with.

With ``launcher.noise`` each measured throughput is multiplied by a log-normal factor drawn for
that measurement (seeded by ``noise_seed``, the job's number and the configuration), as a loaded
machine measures; its step-time CI is widened to the noise's 95% interval.

Time runs on a virtual clock: a submitted trial holds its GPUs from the clock's current time for
its duration (recorded in the table's ``wall_seconds`` or ``train_runtime`` column, or simulated
from the study's ``launcher.durations``, see :class:`~explorer.spec.DurationSpec`), and ``wait``
moves the clock to the next completion. Nothing sleeps, unless ``durations.time_scale`` asks for
the replay to be paced in real time.
"""

from __future__ import annotations

import csv
import dataclasses
import heapq
import math
import random
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explorer.errors import SpecError
from explorer.fault import CRASH_EXIT_STATUS, InjectedFault
from explorer.job import TrialJob
from explorer.knobs import asking_order, knob, knobs
from explorer.launch._slot import GpuSlot, new_run_id
from explorer.measurement import Measurement, Outcome, Properties
from explorer.paths import open_table, table_file
from explorer.spec import DurationSpec
from explorer.trial_config import TrialConfig

__all__ = ["ReplayLauncher", "ReplayTable"]

OBJECTIVE = "dataset_tokens_per_second_per_gpu"
MAX_TABLE_BYTES = 64 << 20


def parameters() -> set[str]:
    """Table columns matched against a trial's :class:`TrialConfig`: the knobs."""
    return {k.name for k in knobs()}


RECORDED_SECONDS = ("wall_seconds", "train_runtime")
"""Columns that record how long a trial took, the first present wins."""


def _parse(name: str, text: str) -> Any:
    text = text.strip()
    if text in ("", "None", "none", "null", "NaN", "nan"):
        return None
    kind = knob(name).kind
    if kind == "int":
        return int(float(text))
    if kind == "float":
        return float(text)
    if kind == "bool":
        return _bool(text)
    return text


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "1.0", "true", "yes"):
        return True
    if lowered in ("0", "0.0", "false", "no"):
        return False
    raise ValueError(f"{text!r} is not a boolean")


def _normalise(values: dict[str, Any]) -> dict[str, Any]:
    """One spelling per job: a knob that does not apply (by its condition on another column) takes
    its inactive value (a single GPU has no backend; only FSDP has FSDP settings); an empty cell of
    a knob that applies reads as its default (a row written before the knob existed)."""
    out = dict(values)
    backend = out.get("distributed_backend")
    if isinstance(backend, str):  # ado's spellings
        out["distributed_backend"] = "NONE" if backend.upper() in ("NONE", "NO", "DP") else backend.upper()
    for k in asking_order():
        if k.name not in out:
            continue
        if k.when is not None and k.when.parent in out and not k.applies(out, {}):
            out[k.name] = k.inactive
        elif out[k.name] is None and k.default is not None and k.when is None:
            out[k.name] = k.default
    return out


@dataclass(frozen=True)
class _Row:
    line: int
    params: dict[str, Any]
    values: dict[str, float]
    valid: bool


class ReplayTable:
    """The rows of a recorded table that match a study's fixed properties."""

    def __init__(
        self, *, path: Path, columns: list[str], rows: list[_Row], default_gpu_model: str | None = None
    ) -> None:
        self.path = path
        self.default_gpu_model = default_gpu_model
        """The GPU model of a configuration that names none (the study's ``resources.gpu_model``)."""
        self.rows = rows
        # gpu_model is matched only where the study says which model a configuration without one
        # runs on (a table read without it, as before the knob, ignores the column)
        self.parameters = [
            c for c in columns if c in parameters() and (c != "gpu_model" or default_gpu_model is not None)
        ]
        self._index: dict[tuple[Any, ...], list[_Row]] = {}
        for row in rows:
            self._index.setdefault(self._key(row.params), []).append(row)

    def _key(self, params: dict[str, Any]) -> tuple[Any, ...]:
        """A configuration's values of the table's parameter columns, in column order."""
        return tuple(params.get(name) for name in self.parameters)

    @classmethod
    def read(
        cls,
        path: Path,
        *,
        model_name: str | None = None,
        gpu_model: str | None = None,
        method: str | None = None,
        label: str = "launcher.table",
        default_gpu_model: str | None = None,
    ) -> ReplayTable:
        """Read ``path``, keeping the rows measured with the given fixed properties.

        (``model_max_length`` is a configuration field: each trial's is matched row by row; so is
        ``gpu_model`` where the table has the column and the study searches it, a configuration
        without one reading as ``default_gpu_model``, else ``gpu_model``.)

        Raises:
            SpecError: unreadable file, no objective column, a value that does not parse, or no
                row left for the study.
        """
        if not table_file(path).is_file():
            raise SpecError(file=str(path), field=label, problem="file does not exist")
        if table_file(path).stat().st_size > MAX_TABLE_BYTES:
            raise SpecError(file=str(path), field=label, problem=f"larger than {MAX_TABLE_BYTES} bytes")
        with open_table(path) as fh:
            reader = csv.DictReader(fh)
            columns = [c for c in (reader.fieldnames or []) if c is not None]
            if OBJECTIVE not in columns:
                raise SpecError(file=str(path), field=label, problem=f"has no {OBJECTIVE} column")
            fixed = {"model_name": model_name, "gpu_model": gpu_model, "method": method}
            rows = []
            known = parameters()
            for line, raw in enumerate(reader, start=2):
                try:
                    if any(
                        want is not None and name in raw and str(raw[name]).strip() != str(want)
                        for name, want in fixed.items()
                    ):
                        continue
                    params = _normalise({c: _parse(c, raw[c] or "") for c in columns if c in known})
                    values = {
                        c: float(raw[c])
                        for c in columns
                        if c not in known and raw.get(c) not in (None, "") and _is_number(raw[c])
                    }
                    if not _measured(raw):
                        continue
                    valid = _bool(raw["is_valid"] or "1") if "is_valid" in raw else True
                except ValueError as exc:
                    raise SpecError(file=str(path), field=f"line {line}", problem=str(exc)) from None
                rows.append(_Row(line=line, params=params, values=values, valid=valid))
        if not rows:
            wanted = ", ".join(f"{k}={v}" for k, v in fixed.items() if v is not None and k in columns)
            raise SpecError(file=str(path), field=label, problem=f"no row matches the study ({wanted})")
        return cls(path=path, columns=columns, rows=rows, default_gpu_model=default_gpu_model or gpu_model)

    def lookup(self, config: TrialConfig) -> list[_Row]:
        """The rows measured with ``config`` (parameters without a column are not compared)."""
        want = _normalise({name: getattr(config, name) for name in self.parameters})
        if "gpu_model" in want and want["gpu_model"] is None:
            want["gpu_model"] = self.default_gpu_model
        return list(self._index.get(self._key(want), ()))

    def missing_columns(self, configs: Iterable[TrialConfig]) -> list[str]:
        """Configuration fields that vary over ``configs`` but have no column in the table."""
        seen: dict[str, set[Any]] = {}
        for config in configs:
            for name, value in config.to_dict().items():
                seen.setdefault(name, set()).add(value)
        return sorted(
            name for name, values in seen.items() if len(values) > 1 and name not in self.parameters
        )

    def measurement(self, config: TrialConfig) -> Measurement:
        """What the table says about ``config``."""
        rows = self.lookup(config)
        if not rows:
            return Measurement(
                outcome=Outcome.FAILED,
                error=f"not in the replay table {self.path.name}: {config.key()}",
                extra={"replay": "absent"},
            )
        valid = [r for r in rows if r.valid and OBJECTIVE in r.values]
        lines = [r.line for r in rows]
        if not valid:
            return Measurement(
                outcome=Outcome.OOM,
                error=f"is_valid=0 in the replay table {self.path.name} (line {lines[0]})",
                wall_seconds=next((s for s in map(_recorded_seconds, rows) if s > 0), 0.0),
                extra={"replay": "infeasible", "replay_lines": lines},
            )
        tput = statistics.median(r.values[OBJECTIVE] for r in valid)
        row = min(valid, key=lambda r: abs(r.values[OBJECTIVE] - tput))
        return Measurement(
            outcome=Outcome.OK,
            properties=_properties(row.values, tput, config),
            wall_seconds=_recorded_seconds(row),
            extra={"replay": "row", "replay_lines": lines},
        )


def _recorded_seconds(row: _Row) -> float:
    """How long the row's trial took, as recorded (0.0: not recorded)."""
    for name in RECORDED_SECONDS:
        value = row.values.get(name)
        if value is not None and math.isfinite(value) and value > 0:
            return value
    return 0.0


def _measured(raw: dict[str, str | None]) -> bool:
    """Whether a row of an explorer export is a measurement: not a failed, interrupted or retried
    trial, and not a copy of another row (``reused_from``). Other tables have no such columns."""
    status = (raw.get("status") or "").strip()
    if status and status not in ("ok", "oom", "invalid"):
        return False
    return not (raw.get("reused_from") or "").strip()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _properties(values: dict[str, float], tput: float, config: TrialConfig) -> Properties:
    """Properties from a table row; what the table does not hold is NaN (never invented)."""
    nan = math.nan

    def get(name: str) -> float:
        return values.get(name, nan)

    system_names = [n for n in values if n.startswith(("gpu_", "cpu_"))]
    return Properties(
        dataset_tokens_per_second=values.get("dataset_tokens_per_second", tput * config.number_gpus),
        dataset_tokens_per_second_per_gpu=tput,
        train_tokens_per_second=get("train_tokens_per_second"),
        train_runtime=get("train_runtime"),
        train_samples_per_second=get("train_samples_per_second"),
        train_steps_per_second=get("train_steps_per_second"),
        peak_memory_gib=get("peak_memory_gib"),
        peak_memory_allocated_gib=get("peak_memory_allocated_gib"),
        measured_steps=int(values.get("measured_steps", 0)),
        warmup_steps=int(values.get("warmup_steps", 0)),
        measured_seconds=get("measured_seconds"),
        warmup_seconds=get("warmup_seconds"),
        step_time_mean=get("step_time_mean"),
        step_time_cv=get("step_time_cv"),
        step_time_rel_ci=values.get("step_time_rel_ci"),
        stop_reason="replay",
        model_flops_per_token=get("model_flops_per_token"),
        peak_flops=get("peak_flops"),
        mfu=get("mfu"),
        hfu=get("hfu"),
        system={n: values[n] for n in system_names},
        measured_dataset_tokens=int(values.get("measured_dataset_tokens", 0)),
        measured_train_tokens=int(values.get("measured_train_tokens", 0)),
        measured_samples=int(values.get("measured_samples", 0)),
        device="replay",
    )


@dataclass(order=True)
class _Held:
    end: float
    seq: int
    start: float = dataclasses.field(compare=False)
    trial_number: int = dataclasses.field(compare=False)
    gpus: int = dataclasses.field(compare=False)
    measurement: Measurement = dataclasses.field(compare=False)
    gpu_model: str | None = dataclasses.field(default=None, compare=False)
    restarts_node: bool = dataclasses.field(default=False, compare=False)
    """An injected ``node_restart``: when it ends, every trial still held fails with it."""


def simulated_fault(fault: InjectedFault, measurement: Measurement, *, timeout_s: float) -> Measurement:
    """What an injected fault makes of a replayed trial (its table answer is thrown away).

    The error says that the fault was simulated; the text after that is what the Ray launcher
    reports for the real fault. Durations come from the outcome (``oom_s``, ``failed_s``), except
    ``hang`` (the trial timeout) and the launcher faults (``kill_after_s``), set by the caller.
    """
    prefix = f"injected fault {fault.kind!r} (simulated): "
    if fault.kind == "oom":
        return Measurement(outcome=Outcome.OOM, error=prefix + "DefaultCPUAllocator: can't allocate memory")
    text = {
        "crash": f"training processes ended with exit status {CRASH_EXIT_STATUS} and reported nothing",
        "segfault": "training processes ended with killed by signal 11 and reported nothing",
        "hang": f"timed out after {timeout_s:.0f} s; the process group was killed",
        "actor_kill": "Ray: The actor died unexpectedly before finishing this task.",
        "node_restart": "Ray: the node restarted; every trial on it was lost",
    }[fault.kind]
    return Measurement(outcome=Outcome.FAILED, error=prefix + text, extra=dict(measurement.extra))


def noisy(measurement: Measurement, *, sigma: float, seed: str) -> Measurement:
    """``measurement`` with its throughput (and step time, MFU) scaled by ``exp(sigma * z)``, ``z``
    a standard normal drawn from ``seed``, and its step-time 95% CI at least ``1.96 * sigma``;
    unchanged where ``sigma`` is 0 or nothing was measured."""
    p = measurement.properties
    if not sigma or p is None:
        return measurement
    factor = math.exp(sigma * random.Random(seed).gauss(0.0, 1.0))
    ci = max(p.step_time_rel_ci or 0.0, 1.96 * sigma)
    scaled = dataclasses.replace(
        p,
        dataset_tokens_per_second=p.dataset_tokens_per_second * factor,
        dataset_tokens_per_second_per_gpu=p.dataset_tokens_per_second_per_gpu * factor,
        train_tokens_per_second=p.train_tokens_per_second * factor,
        step_time_mean=p.step_time_mean / factor,
        step_time_rel_ci=ci,
        mfu=p.mfu * factor,
        hfu=p.hfu * factor,
    )
    return dataclasses.replace(measurement, properties=scaled)


class ReplayLauncher:
    """Same interface as :class:`~explorer.launch.RayLauncher`, on a virtual clock.

    ``submit`` answers the trial from the table at once but holds its GPUs from the current virtual
    time for the trial's duration; ``fits`` answers from the GPUs held; ``wait`` advances the clock
    to the next completion and hands back every trial that ends then. Each measurement carries its
    :class:`~explorer.launch.GpuSlot` (``extra["slot"]``) and its duration as ``wall_seconds``.
    """

    def __init__(
        self,
        *,
        table: ReplayTable,
        total_gpus: int,
        durations: DurationSpec | None = None,
        gpu_models: dict[str, int] | None = None,
        noise: float = 0.0,
        noise_seed: int = 0,
    ) -> None:
        self.table = table
        self.noise, self.noise_seed = noise, noise_seed
        self.total_gpus = total_gpus
        self.gpu_models = dict(gpu_models or {})
        """The GPUs of each model (empty: one model, :attr:`total_gpus`): a replayed pool per model."""
        self.durations = durations
        self.clock = 0.0
        """Virtual seconds since the launcher was created (started, when paced in real time)."""
        self._scale = durations.time_scale if durations is not None else 0.0
        self._t0 = time.monotonic()
        self.run_id = new_run_id()
        self._held: list[_Held] = []  # a heap, soonest end first
        self._seq = 0

    def start(self) -> None:
        """Nothing to start (a paced replay's clock starts now)."""
        self._t0 = time.monotonic() - self.clock * self._scale

    def _now(self) -> float:
        """The virtual time: real time since start over the scale when paced, else the clock."""
        if not self._scale:
            return self.clock
        return max(self.clock, (time.monotonic() - self._t0) / self._scale)

    def shutdown(self) -> None:
        self._held.clear()

    @property
    def gpus_in_use(self) -> int:
        return sum(h.gpus for h in self._held)

    def fits(self, number_gpus: int, number_nodes: int = 1, gpu_model: str | None = None) -> bool:
        """Whether a trial of ``number_gpus`` (of ``gpu_model``; ``None``: of any model) can start
        now, beside the trials holding GPUs.

        The replayed pool is one set of GPUs per model: ``number_nodes`` does not change the answer.
        """
        if not self.gpu_models:
            return self.gpus_in_use + number_gpus <= self.total_gpus
        models = [gpu_model] if gpu_model is not None else list(self.gpu_models)
        return any(self._held_of(m) + number_gpus <= self.gpu_models.get(m, 0) for m in models)

    def _held_of(self, gpu_model: str) -> int:
        return sum(h.gpus for h in self._held if h.gpu_model == gpu_model)

    def duration(self, trial_number: int, measurement: Measurement) -> float:
        """Virtual seconds the trial holds its GPUs: recorded, else simulated (see
        :class:`~explorer.spec.DurationSpec`); 0.0 with neither."""
        spec = self.durations
        if (spec is None or spec.use_recorded) and measurement.wall_seconds > 0:
            return measurement.wall_seconds
        if spec is None:
            return 0.0
        base = {Outcome.OK: spec.ok_s, Outcome.OOM: spec.oom_s}.get(measurement.outcome, spec.failed_s)
        u = random.Random(f"{spec.seed}:{trial_number}").uniform(-1.0, 1.0)
        return base * (1.0 + spec.jitter * u)

    def submit(self, job: TrialJob) -> None:
        """Start the trial now on the virtual clock.

        Raises:
            RuntimeError: its GPUs are not free (the caller asks :meth:`fits` first).
        """
        gpus = job.config.number_gpus
        model = (job.config.gpu_model or job.resources.gpu_model) if self.gpu_models else None
        if not self.fits(gpus, gpu_model=model):
            raise RuntimeError(
                f"trial {job.trial_number} needs {gpus} GPUs; {self.gpus_in_use} of {self.total_gpus} are held"
            )
        measurement = self.table.measurement(job.config)
        seed = f"{self.noise_seed}:{job.trial_number}:{job.config.key()}"
        measurement = noisy(measurement, sigma=self.noise, seed=seed)
        self.clock = self._now()
        fault = job.fault
        if fault is not None:
            measurement = simulated_fault(fault, measurement, timeout_s=job.measurement.trial_timeout_s)
        if fault is None or fault.kind in ("oom", "crash", "segfault"):
            took = self.duration(job.trial_number, measurement)
        else:
            took = job.measurement.trial_timeout_s if fault.kind == "hang" else fault.kill_after_s
        self._seq += 1
        heapq.heappush(
            self._held,
            _Held(
                self.clock + took,
                self._seq,
                self.clock,
                job.trial_number,
                gpus,
                measurement,
                gpu_model=model,
                restarts_node=fault is not None and fault.kind == "node_restart",
            ),
        )

    def wait(self, timeout_s: float) -> list[tuple[int, Measurement]]:
        """Advance the clock to the next completion; the trials that end then.

        ``timeout_s`` is used only when paced in real time: the wait ends after that long (with
        no trials, if none ended by then); virtual time never waits.
        """
        if not self._held:
            return []
        if self._scale:
            ahead = (self._held[0].end - self._now()) * self._scale
            if ahead > 0:
                time.sleep(min(ahead, timeout_s))
            now = self._now()
            if self._held[0].end > now:
                self.clock = now
                return []
        self.clock = max(self.clock, self._held[0].end)
        done: list[tuple[int, Measurement]] = []
        ended: list[_Held] = []
        while self._held and self._held[0].end <= self.clock:
            ended.append(heapq.heappop(self._held))
            if ended[-1].restarts_node:  # the node went down: everything it ran is lost
                for lost in self._held:
                    error = "Ray: the node restarted; every trial on it was lost (simulated)"
                    lost.measurement = Measurement(outcome=Outcome.FAILED, error=error)
                    lost.end = self.clock
                ended.extend(sorted(self._held))
                self._held.clear()
        for held in ended:
            slot = GpuSlot(
                run=self.run_id,
                clock="virtual",
                pool=self.total_gpus,
                gpus=held.gpus,
                start=held.start,
                end=held.end,
            )
            done.append((held.trial_number, slot.stamp(held.measurement, wall_seconds=held.end - held.start)))
        return done
