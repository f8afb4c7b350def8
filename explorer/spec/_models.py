"""Typed study file: every section is a frozen pydantic model that rejects unknown keys."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from explorer.errors import did_you_mean
from explorer.spec._objectives import OBJECTIVE, OBJECTIVE_TABLE, FirstObjective, SecondObjective

__all__ = [
    "BudgetSpec",
    "DatasetSpec",
    "FAULT_KINDS",
    "LENGTH_DEFAULTS",
    "parse_amount",
    "parse_hours",
    "SYNTHETIC_PRESETS",
    "STRATEGIES",
    "DurationSpec",
    "FaultKind",
    "FaultSpec",
    "GpuFiguresSpec",
    "LAUNCHER_CONFIGS",
    "LauncherSpec",
    "RayLauncherSpec",
    "ReplayLauncherSpec",
    "MeasurementSpec",
    "MethodSpec",
    "ModelSpec",
    "ResourcesSpec",
    "SamplerSpec",
    "StudySpec",
    "SyntheticPreset",
    "WorkloadSpec",
]

# Every field is strict (``_Spec``): YAML already types its values, so a bool, a float or a quoted
# string where a number is expected is a mistake (lax pydantic would read ``gpus_per_node: true``
# as 1, ``target_rel_ci: "0.05"`` as 0.05 and ``infer_oom: 1`` or ``"off"`` as a bool), and so is
# a NaN or an infinity (``.nan``, ``.inf``). The aliases below keep the bounds in one place.
Int = Annotated[int, Field(strict=True)]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0, strict=True)]
NonNegativeFloat = Annotated[float, Field(ge=0, strict=True)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1, strict=True)]
"""A random seed as numpy and Optuna take it."""


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError(f"{value!r} is empty or blank")
    return value


NonEmptyStr = Annotated[str, AfterValidator(_not_blank)]
"""A name, label or path: an empty or blank one is a mistake (``gpu_model: ""`` is a Ray resource
no node has; ``path: ""`` is the study's own folder)."""
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

MAX_NAME_LENGTH = 128
"""Longest study name: ``<name>.db-journal`` and the like must fit a file name (255 bytes)."""

LengthDistribution = Literal["uniform", "lognormal"]
"""How synthetic entry lengths are drawn between ``min_tokens`` and ``max_tokens``."""


@dataclass(frozen=True)
class SyntheticPreset:
    """A named synthetic dataset: the :class:`DatasetSpec` fields it sets."""

    entries: int
    min_tokens: int
    max_tokens: int | None = None
    """``None``: every entry is ``min_tokens`` long (and a study may set ``max_tokens`` itself)."""
    lengths: LengthDistribution = "uniform"
    median_tokens: int | None = None
    sigma: float | None = None

    def fields(self) -> dict[str, Any]:
        """The dataset fields the preset sets (a ``None`` is left to the study)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


SYNTHETIC_PRESETS: dict[str, SyntheticPreset] = {
    # ado's synthetic dataset id (seed 001): 4096 entries of 16384 tokens each.
    "news-tokens-16384plus-entries-4096": SyntheticPreset(entries=4096, min_tokens=16384),
    # Single-turn instruction data (Alpaca- or Dolly-like prompt + response): half of it 170-375 tokens.
    "instruction-short": SyntheticPreset(
        entries=4096, min_tokens=100, max_tokens=800, lengths="lognormal", median_tokens=250, sigma=0.6
    ),
    # Multi-turn chat data (ShareGPT-like conversations): half of it 640-1650 tokens, a long tail.
    "instruction-long": SyntheticPreset(
        entries=4096, min_tokens=256, max_tokens=4096, lengths="lognormal", median_tokens=1024, sigma=0.7
    ),
}
"""Named synthetic datasets, for ``dataset.preset``."""

LENGTH_DEFAULTS: dict[str, Any] = {"lengths": "uniform", "median_tokens": None, "sigma": None}
"""The length-distribution fields at their defaults: left out of a dump (so a study written before
they existed keeps its store key, :func:`explorer.store.workload_key`)."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSpec(_Spec):
    """The model to fine-tune.

    Exactly one of ``architecture`` (a transformers config built locally, random weights) or
    ``path`` (a Hugging Face id or a local directory) is given.
    """

    name: NonEmptyStr
    """Label used in results and exports (ado's ``model_name``)."""
    architecture: dict[str, Any] | None = None
    """Keyword arguments of ``transformers.AutoConfig.for_model``, ``model_type`` included."""
    path: NonEmptyStr | None = None
    """Hugging Face model id or local directory."""
    weights: Literal["random", "pretrained"] = "random"
    """With ``path``: load the checkpoint's weights, or only its config. Throughput does not depend
    on the weights, so ``random`` avoids downloading them."""
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.architecture is None) == (self.path is None):
            raise ValueError("give exactly one of 'architecture' or 'path'")
        if self.architecture is not None and "model_type" not in self.architecture:
            raise ValueError("architecture needs a 'model_type' (for example 'llama')")
        if self.architecture is not None and self.weights == "pretrained":
            raise ValueError("weights: pretrained needs 'path', an architecture has no weights")
        return self

    @property
    def is_hub_id(self) -> bool:
        """Whether ``path`` names a hub repository rather than a local directory."""
        path = self.path or ""
        return not path.startswith((".", "/", "~")) and bool(HUB_ID.match(path))


class DatasetSpec(_Spec):
    """Training data: a synthetic token generator or a JSONL file with a text field.

    A synthetic entry's length (before truncation at the sequence length) lies in ``[min_tokens,
    max_tokens]``, drawn as ``lengths`` says: ``uniform`` (every length equally likely), or
    ``lognormal`` (``median_tokens * exp(sigma * z)``, ``z`` standard normal, rounded and clipped to
    the bounds: the right-skewed shape of instruction and chat data). Each entry's length depends
    on ``seed`` and its index only (:func:`explorer.worker._data.entry_length`). A ``preset`` sets
    these fields at once (:data:`SYNTHETIC_PRESETS`); a field given beside it must agree with it.
    """

    kind: Literal["synthetic", "jsonl"] = "synthetic"
    preset: str | None = None
    """Synthetic only: a named dataset (:data:`SYNTHETIC_PRESETS`): ado's
    ``news-tokens-16384plus-entries-4096``, ``instruction-short`` or ``instruction-long``."""
    entries: PositiveInt = 4096
    """Synthetic only: number of entries."""
    min_tokens: PositiveInt = 16384
    """Synthetic only: shortest entry, in tokens."""
    max_tokens: PositiveInt | None = None
    """Synthetic only: longest entry (defaults to ``min_tokens``: all entries equally long)."""
    lengths: LengthDistribution = "uniform"
    """Synthetic only: how entry lengths are drawn: ``uniform`` (the default) or ``lognormal``
    (needs ``median_tokens``, ``sigma`` and a ``max_tokens`` above ``min_tokens``)."""
    median_tokens: PositiveInt | None = None
    """``lengths: lognormal``: the median entry length, in tokens, within [min_tokens, max_tokens]."""
    sigma: Annotated[float, Field(gt=0, le=3, strict=True)] | None = None
    """``lengths: lognormal``: the standard deviation of the log length (0.6: half the entries
    within x0.67..x1.5 of the median, 95% within x0.31..x3.2, before clipping)."""
    seed: Int = 0
    """Synthetic only: the seed of the entry lengths."""
    path: NonEmptyStr | None = None
    """JSONL only: the file (relative paths are relative to the study file)."""
    text_field: NonEmptyStr = "output"
    """JSONL only: the field holding the text (ado's ``dataset_text_field``)."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """Fill in a known preset's fields; refuse a field given beside it that says otherwise."""
        if not isinstance(data, dict) or not isinstance(data.get("preset"), str):
            return data
        preset = SYNTHETIC_PRESETS.get(data["preset"])
        if preset is None:
            return data  # refused by _check, with the known names
        for key, value in preset.fields().items():
            if key in data and data[key] != value:
                raise ValueError(
                    f"preset {data['preset']!r} sets {key} to {value}, not {data[key]!r}: "
                    f"leave {key} out, or the preset"
                )
        return {**data, **preset.fields()}

    @field_validator("median_tokens", "sigma")
    @classmethod
    def _lognormal_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        lengths = info.data.get("lengths")
        if lengths != "lognormal":
            raise ValueError(f"only for lengths: lognormal (lengths is {lengths!r})")
        lo, hi = info.data.get("min_tokens"), info.data.get("max_tokens")
        bounded = info.field_name == "median_tokens" and lo is not None and hi is not None and lo <= hi
        if bounded and not lo <= value <= hi:
            raise ValueError(f"{value} is outside [min_tokens, max_tokens] = [{lo}, {hi}]")
        return value

    @model_validator(mode="after")
    def _check(self) -> DatasetSpec:
        if self.kind == "jsonl":
            self._check_jsonl()
        if self.kind == "synthetic" and self.path:
            raise ValueError("'path' is for kind: jsonl")
        if self.preset is not None and self.preset not in SYNTHETIC_PRESETS:
            hint = did_you_mean(self.preset, SYNTHETIC_PRESETS)
            raise ValueError(f"unknown preset {self.preset!r}{hint}; known: {', '.join(SYNTHETIC_PRESETS)}")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError("max_tokens is smaller than min_tokens")
        if self.lengths == "lognormal":
            if self.median_tokens is None or self.sigma is None:
                raise ValueError("lengths: lognormal needs median_tokens and sigma")
            if self.resolved_max_tokens == self.min_tokens:
                raise ValueError("lengths: lognormal needs a max_tokens above min_tokens")
        return self

    def _check_jsonl(self) -> None:
        if not self.path:
            raise ValueError("a jsonl dataset needs 'path'")
        defaults = type(self).model_fields
        synthetic = ("preset", "entries", "min_tokens", "max_tokens", *LENGTH_DEFAULTS)
        given = [key for key in synthetic if getattr(self, key) != defaults[key].default]
        if given:
            raise ValueError(f"'{given[0]}' is for kind: synthetic (a jsonl file has its own entries)")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        """The fields, less the length-distribution ones at their defaults (:data:`LENGTH_DEFAULTS`)."""
        data = handler(self)
        if isinstance(data, dict):
            for key, default in LENGTH_DEFAULTS.items():
                if key in data and data[key] == default:
                    del data[key]
        return data

    @property
    def resolved_entries(self) -> int:
        return self.entries

    @property
    def resolved_min_tokens(self) -> int:
        return self.min_tokens

    @property
    def resolved_max_tokens(self) -> int:
        return self.max_tokens or self.min_tokens


class MethodSpec(_Spec):
    """Full fine-tuning, or LoRA through peft."""

    kind: Literal["full", "lora"] = "full"
    r: PositiveInt = 4
    """LoRA rank (ado's default 4); a search space may vary it as ``lora_r``."""
    alpha: PositiveInt = 16
    """LoRA alpha (ado's default 16)."""
    target_modules: list[NonEmptyStr] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, strict=True)


class WorkloadSpec(_Spec):
    """What is fine-tuned, on what, and how."""

    model: ModelSpec
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    model_max_length: PositiveInt = 1024
    """Default sequence length (a search space may vary it)."""
    method: MethodSpec = Field(default_factory=MethodSpec)
    torch_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Mixed-precision dtype on CUDA. The CPU path always trains in float32."""
    training_arguments: dict[str, Any] = Field(default_factory=dict)
    """Extra ``TrainingArguments`` fields for every trial (e.g. ``dataloader_num_workers: 2``),
    checked against transformers' fields; those explorer decides are refused
    (:mod:`explorer.passthrough`). Left out of a dump when empty, so a study without it keeps the
    key its stored measurements were recorded under."""
    trainer: Literal["transformers", "trl"] = "transformers"
    """The trainer each rank measures: ``transformers`` (the ``Trainer``, explorer's own dataset
    and collator) or ``trl`` (TRL's ``SFTTrainer`` with the configuration's ``SFTConfig``, the data
    through TRL's own preparation: ``pip install 'explorer[trl]'``). Left out of a dump at
    ``transformers``, so a study without it keeps the key its stored measurements were recorded
    under."""

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and not data.get("training_arguments"):
            data.pop("training_arguments", None)
        if isinstance(data, dict) and data.get("trainer") == "transformers":
            data.pop("trainer", None)
        return data

    @model_validator(mode="after")
    def _tokenizer_for_text(self) -> WorkloadSpec:
        if self.dataset.kind == "jsonl" and self.model.path is None:
            raise ValueError(
                "a jsonl dataset is read with the model's tokenizer: give model.path (a hub id, or a "
                "folder with config.json and a tokenizer, such as studies/local-model), not an architecture"
            )
        if self.trainer == "trl" and self.dataset.kind != "jsonl":
            raise ValueError(
                "trainer trl trains on text through TRL's own preparation: give a jsonl dataset "
                "(dataset.kind: jsonl), not synthetic tokens"
            )
        return self


StopRule = Literal["steady", "steps", "seconds", "warmup_then_stable"]


class MeasurementSpec(_Spec):
    """How long each trial trains and which steps count.

    Stop rules:

    * ``steady`` (default): after ``warmup_steps``, stop once the 95% confidence interval of the
      mean step time is within ``target_rel_ci`` of the mean, over at least ``min_steps`` steps;
      ``max_steps`` / ``max_seconds`` cap the measured window. A one-off spike early in the
      window (``spike_factor``) extends the warmup past it.
    * ``steps``: exactly ``measured_steps`` steps after warmup (the default when ``measured_steps``
      is given and ``stop`` is not).
    * ``seconds``: ado's ``stop_after_seconds``: train for ``stop_after_seconds`` in total; the
      ``warmup_steps`` are excluded from the throughput.
    * ``warmup_then_stable``: ado's ``WARMUP_60S_STABLE_120S_OR_10_STEPS``: the steps that end within
      the first ``warmup_seconds`` are warmup; then measure for the longer of ``stable_seconds`` and
      ``stable_steps`` steps.
    """

    stop: StopRule | None = None
    """The stop rule (``steady``, or ``steps`` when ``measured_steps`` is set)."""
    warmup_steps: NonNegativeInt = 2
    """Optimizer steps excluded from throughput (the first one also surfaces OOM)."""
    measured_steps: PositiveInt = 10
    """``steps``: optimizer steps measured after warmup."""
    target_rel_ci: float = Field(default=0.02, gt=0, lt=1)
    """``steady``: relative half-width of the 95% CI of the mean step time to stop at."""
    min_steps: Annotated[int, Field(ge=2)] = 5
    """``steady``: fewest measured steps before the rule may stop."""
    max_steps: PositiveInt = 200
    """``steady``: most measured steps."""
    max_seconds: PositiveFloat = 300.0
    """``steady``: longest measured window."""
    spike_factor: float | None = Field(default=3.0, gt=1)
    """``steady``: a step longer than this many times the window's median step, among the first
    ``min_steps`` steps after ``warmup_steps``, is a one-off (allocator growth, a lazy
    initialisation) and moves into the warmup with every step before it. ``null`` turns it off."""
    stop_after_seconds: PositiveFloat | None = None
    """``seconds``: total training time."""
    warmup_seconds: PositiveFloat = 60.0
    stable_seconds: PositiveFloat = 120.0
    stable_steps: PositiveInt = 10
    trial_timeout_s: PositiveFloat = 1800.0
    """The whole process group is killed after this long; the trial is FAILED."""

    @model_validator(mode="after")
    def _check_rule(self) -> MeasurementSpec:
        if self.rule == "seconds" and self.stop_after_seconds is None:
            raise ValueError("stop: seconds needs stop_after_seconds")
        if self.rule == "steady" and self.min_steps > self.max_steps:
            raise ValueError("min_steps is larger than max_steps")
        return self

    @property
    def rule(self) -> str:
        """The stop rule in force."""
        if self.stop is not None:
            return self.stop
        return "steps" if "measured_steps" in self.model_fields_set else "steady"

    @property
    def step_budget(self) -> int:
        """An upper bound on optimizer steps, for the Trainer's ``max_steps``."""
        if self.rule == "steps":
            return self.warmup_steps + self.measured_steps
        if self.rule == "steady":  # the warmup may grow by up to min_steps (spike_factor)
            return self.warmup_steps + self.min_steps + self.max_steps
        return 10_000_000


class GpuFiguresSpec(_Spec):
    """The data-sheet figures of a GPU that :mod:`explorer.gpus` does not know (or that differ from
    its row there: a power-capped card); a figure left out is the table's."""

    bf16_tflops: PositiveFloat | None = None
    """Dense bf16 tensor-core peak, TFLOP/s (no 2:4 sparsity)."""
    memory_gib: PositiveFloat | None = None
    """Memory a process may use, GiB (as CUDA reports it)."""
    bandwidth_tbs: PositiveFloat | None = None
    """Peak memory bandwidth, TB/s."""
    link_gbs: PositiveFloat | None = None
    """GPU-to-GPU bandwidth inside a node per GPU, GB/s both directions (NVLink 4: 900, PCIe 4.0 x16: 64)."""


class ResourcesSpec(_Spec):
    """The hardware trials may use."""

    gpus_per_node: PositiveInt = 1
    nodes: PositiveInt = 1
    gpu_model: NonEmptyStr | None = None
    """Name of the GPU model; also requested as a Ray custom resource, as ado does. With
    :attr:`gpu_models`: the default of the ``gpu_model`` knob (the first declared model when left
    out), one of the declared models. Left out with one model: read from the device when the
    study is loaded (:mod:`explorer.hardware`): ``CPU-logical`` for ``device: cpu``, the GPU's name from
    NVML on this machine's CUDA; required on a Ray cluster and for a replay table. Never guessed."""
    gpu_models: dict[NonEmptyStr, PositiveInt] | None = None
    """The GPU models trials may run on, with the GPUs of each (``{NVIDIA-H100-80GB-HBM3: 8,
    NVIDIA-A100-SXM4-80GB: 8}``): the values the ``gpu_model`` knob may take. The local Ray
    declares that many logical GPUs of each; on a cluster (``launcher.address``) it is the most
    GPUs of that model the study uses at once, and the nodes say what they have (Ray's
    ``accelerator_type:<type>`` resource). ``None``: one model, :attr:`gpu_model`."""
    gpu: GpuFiguresSpec | None = None
    """The GPU's figures, for a model the table of GPUs (:mod:`explorer.gpus`) does not know:
    a CUDA study on such a GPU is refused until it declares them; for a known model, figures that
    replace the table's."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """``auto`` uses CUDA when the worker sees a GPU, else the CPU with gloo."""
    device_memory_gib: PositiveFloat | None = None
    """Cap on memory per process, to make a large device behave like a smaller one. CUDA:
    ``set_per_process_memory_fraction``; CPU: ``RLIMIT_AS`` above the process's baseline."""
    cpus_per_trial_process: PositiveInt | None = None
    """Threads per training process on CPU (default: the node's cores divided by the processes)."""

    @model_validator(mode="before")
    @classmethod
    def _default_model(cls, data: Any) -> Any:
        """``gpu_model`` left out beside ``gpu_models``: the first declared model."""
        models = data.get("gpu_models") if isinstance(data, dict) else None
        if isinstance(models, dict) and models and "gpu_model" not in data:
            return {**data, "gpu_model": next(iter(models))}
        return data

    @field_validator("gpu_models")
    @classmethod
    def _declares_gpu_model(
        cls, models: dict[str, int] | None, info: ValidationInfo
    ) -> dict[str, int] | None:
        if models is None:
            return None
        if not models:
            raise ValueError("declares no GPU model; leave it out for one model (gpu_model)")
        default = info.data.get("gpu_model")
        if default is not None and default not in models:
            raise ValueError(
                f"does not declare resources.gpu_model {default!r} (declared: {', '.join(models)})"
                + did_you_mean(default, list(models))
            )
        return models

    @property
    def model(self) -> str:
        """:attr:`gpu_model`, which the loader sets where the file leaves it out
        (:func:`explorer.hardware.with_gpu_model`); ``unknown`` on a spec built without it."""
        return self.gpu_model or "unknown"

    @property
    def models(self) -> dict[str, int]:
        """The GPU models trials may run on and the GPUs of each (one model: :attr:`gpu_model`,
        with :attr:`total_gpus`)."""
        return dict(self.gpu_models) if self.gpu_models else {self.model: self.gpus_per_node * self.nodes}

    def model_of(self, gpu_model: str | None) -> str:
        """The GPU model of a trial whose configuration says ``gpu_model`` (``None``: the
        study's :attr:`gpu_model`)."""
        return gpu_model or self.model

    def gpus_of(self, gpu_model: str | None) -> int:
        """The GPUs of ``gpu_model`` (``None``: :attr:`gpu_model`; 0: not declared)."""
        return self.models.get(gpu_model or self.model, 0)

    @property
    def total_gpus(self) -> int:
        """Every GPU of every model."""
        return sum(self.gpu_models.values()) if self.gpu_models else self.gpus_per_node * self.nodes


class DurationSpec(_Spec):
    """How long a replayed trial holds its GPUs on the replay launcher's virtual clock.

    A trial's duration is the one its table row recorded (a ``wall_seconds`` column, else
    ``train_runtime``), when ``use_recorded`` is on and the row has a positive value; otherwise it
    is simulated: ``ok_s``, ``oom_s`` or ``failed_s`` by the trial's outcome, times ``1 + jitter *
    u`` with ``u`` uniform in [-1, 1], drawn from a generator seeded by ``seed`` and the trial
    number (the same trial always takes the same time, whatever ran beside it).
    """

    ok_s: PositiveFloat = 300.0
    """Seconds a feasible (measured) trial takes."""
    oom_s: PositiveFloat = 60.0
    """Seconds an OOM trial takes (model load and the first step)."""
    failed_s: PositiveFloat = 60.0
    """Seconds a failed trial takes (a configuration absent from the table)."""
    jitter: float = Field(default=0.0, ge=0.0, lt=1.0, strict=True)
    """Relative spread of a simulated duration: each is scaled by a uniform factor in
    ``[1 - jitter, 1 + jitter]``."""
    seed: Int = 0
    """Seed of the jitter."""
    use_recorded: bool = True
    """Take a row's recorded ``wall_seconds`` (else ``train_runtime``) where it has one."""
    time_scale: NonNegativeFloat = 0.0
    """Real seconds per virtual second. ``0`` (the default): nothing sleeps, the clock jumps to
    the next completion. A positive scale paces the replay in real time (``0.01``: a 300 s trial
    holds its GPUs for 3 s), so that status readers, a second driver or a signal meet a study
    that is really running."""


class _LauncherSpec(_Spec):
    """What every launcher kind's section has. A key of another kind's section is refused naming
    that kind, and a required key missing naming this one."""

    kind: str
    max_retries: NonNegativeInt = 1
    """Times a FAILED configuration (crash, NCCL, timeout) is re-run."""

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key in data:
            owner = next((k for k, m in LAUNCHER_CONFIGS.items() if key in m.model_fields), None)
            if key not in cls.model_fields and owner is not None:
                raise ValueError(f"{key} is only for kind: {owner}")
        missing = [name for name, f in cls.model_fields.items() if f.is_required() and name not in data]
        if missing:
            raise ValueError(f"kind: {data.get('kind')} needs a {missing[0]}")
        return data


class RayLauncherSpec(_LauncherSpec):
    """``kind: ray`` (the default): every trial runs, as Ray actors on a local Ray with logical
    GPUs or on a Ray cluster."""

    kind: Literal["ray"] = "ray"
    """Run every trial on Ray."""
    address: NonEmptyStr | None = None
    """Ray cluster address. ``None``: ``RAY_ADDRESS`` if set, else a local Ray with logical GPUs."""
    runner: Literal["torchrun", "accelerate"] = "torchrun"
    """How the processes of one trial are started. Both give one process per GPU."""
    warm_start: bool = True
    """Fork each rank from a per-node process that has already imported torch and transformers
    (saves about 4-5 s per trial on a CPU, so an OOM is found in about a second). Used with one
    node and the torchrun runner (or one process); ``false`` starts fresh interpreters."""


class ReplayLauncherSpec(_LauncherSpec):
    """``kind: replay``: trials answered from a recorded table, on a virtual clock; nothing runs."""

    kind: Literal["replay"] = "replay"
    """Answer trials from the recorded ``table``."""
    table: NonEmptyStr
    """A CSV in the layout of ado's ``ado show entities --output-format csv`` (a column per
    parameter, a column per measured property, ``is_valid``), relative to the study file."""
    durations: DurationSpec | None = None
    """How long each trial holds its GPUs on the launcher's virtual clock. ``None``: the row's
    recorded ``wall_seconds`` or ``train_runtime``, else no time at all."""
    noise: float = Field(default=0.0, ge=0, lt=1)
    """Log-normal noise on each measured throughput (its sigma: ``0.1`` is about 10%), drawn anew
    for every measurement of a configuration (seeded by ``noise_seed``), as a loaded machine
    measures; the trial's step-time 95% CI is widened to match. ``0``: the table's values."""
    noise_seed: int = 0
    """Seeds the noise: the same seed gives the same measurements in the same order."""


LAUNCHER_CONFIGS: dict[str, type[_LauncherSpec]] = {"ray": RayLauncherSpec, "replay": ReplayLauncherSpec}
"""Each ``launcher.kind`` and its section (:data:`explorer.launch.LAUNCHERS` has the same names)."""


def _launcher_kind(value: Any) -> str | None:
    """The ``kind`` of a launcher section: ``ray`` where a mapping leaves it out."""
    if isinstance(value, dict):
        kind = value.get("kind", "ray")
        return kind if isinstance(kind, str) else repr(kind)
    return getattr(value, "kind", "ray")


LauncherSpec = Annotated[
    Annotated[RayLauncherSpec, Tag("ray")] | Annotated[ReplayLauncherSpec, Tag("replay")],
    Discriminator(_launcher_kind),
]
"""Where trials run: the section of the kind ``launcher.kind`` names."""

STRATEGIES = (
    "default",
    "no-inference",
    "no-priors",
    "cover-start",
    "tpe-every-3",
    "no-local-search",
    "random",
    "optuna",
    "gp",
    "walk",
)
"""The search strategies' names, in the order ``benchmark-search`` reports them: each is a class
registered in :mod:`explorer.search._strategies` (``tests/test_strategies.py`` checks that the two
agree). Named here because the study file refuses an unknown name and :mod:`explorer.spec` imports
nothing above it."""
LEGACY_FLAGS: dict[str, object] = {
    "local_search": True,
    "frontier_start": True,
    "global_every": 0,
    "memory_prior": True,
    "throughput_prior": True,
}
"""The sampler's flags before ``strategy`` named the search, with their old defaults."""


class SamplerSpec(_Spec):
    """The search strategy and the Optuna sampler behind it."""

    strategy: str = "default"
    """Which search proposes the trials (:mod:`explorer.search._strategies`, docs/search.md):

    * ``default``: the frontier walk while its probes fit, then the joint models' choice over the
      whole space, around first-principles priors calibrated by the measured trials; the sampler
      (``kind``) is asked when nothing is left open;
    * ``no-inference``: ``default`` without OOM inference (``infer_oom`` ignored);
    * ``cover-start``: ``default`` without the frontier walk; ``tpe-every-3``: ``default`` with
      every third trial from the sampler;
    * ``walk``: the frontier walk, covering start-up trials, then unanswered neighbours of the best
      configurations ordered by the memory and throughput priors; ``no-priors``: the same
      neighbour search without the priors;
    * ``no-local-search``: the sampler (``kind``) alone;
    * ``random``, ``optuna`` (TPE with Optuna's defaults), ``gp`` (Optuna's GPSampler with its
      defaults): plain Optuna samplers as baselines, without OOM inference; they ignore ``kind``
      and ``n_startup_trials``.

    The proposing strategies propose only in front of ``kind: tpe`` or ``gp`` (with ``random`` or
    ``grid`` the sampler alone runs), and the frontier walk and the throughput prior only for an
    objective ranked as the per-GPU rate is. ``when_converged: explore`` works under every one.
    The flags that named a search before (``local_search: false``, ``frontier_start: false``,
    ``global_every: 3``, ``memory_prior`` and ``throughput_prior: false``) load as the strategy
    they were; any other setting of them is refused."""
    kind: Literal["tpe", "gp", "random", "grid"] = "tpe"
    """The Optuna sampler behind the strategy, asked whenever the strategy proposes nothing:
    ``tpe`` (the default: multivariate, grouped for the conditional FSDP parameters, constant
    liar for parallel trials); ``gp`` (Optuna's GPSampler: it has no conditional spaces, so the
    backend and FSDP settings are sampled at random; on the benchmark tables it was worse than TPE
    on two of three); ``random``; ``grid`` (every configuration, enqueued)."""
    seed: Seed | None = 0
    n_startup_trials: NonNegativeInt | None = None
    """TPE/GP: random trials before the model kicks in (explorer's default if unset); the
    strategies' start-up trials (the frontier walk, the covering start) count against it too."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_flags(cls, data: Any) -> Any:
        """The flags that named a search before ``strategy`` (``local_search``, ``frontier_start``,
        ``global_every``, ``memory_prior``, ``throughput_prior``): a setting that was one of the
        strategies becomes its name; any other is refused, naming the field to use."""
        if not isinstance(data, dict) or not LEGACY_FLAGS.keys() & data.keys():
            return data
        given = {k: data[k] for k in LEGACY_FLAGS if k in data}
        rest = {k: v for k, v in data.items() if k not in LEGACY_FLAGS}
        name = None
        if all(type(v) is type(LEGACY_FLAGS[k]) for k, v in given.items()):
            changed = tuple(sorted((k, v) for k, v in given.items() if v != LEGACY_FLAGS[k]))
            name = {
                (): rest.get("strategy", "default"),
                (("memory_prior", False), ("throughput_prior", False)): "no-priors",
                (("frontier_start", False),): "cover-start",
                (("global_every", 3),): "tpe-every-3",
            }.get(changed)
            if given.get("local_search") is False:
                name = "no-local-search"  # the other flags did nothing without it
        if name is None or rest.get("strategy", name) != name:
            flags = ", ".join(
                f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in given.items()
            )
            raise ValueError(
                f"{flags}: the search is named by sampler.strategy now (one of {', '.join(STRATEGIES)})"
            )
        return {**rest, "strategy": name}

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, name: str) -> str:
        if name not in STRATEGIES:
            raise ValueError(
                f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})" + did_you_mean(name, STRATEGIES)
            )
        return name


FaultKind = Literal["oom", "crash", "segfault", "hang", "actor_kill", "node_restart"]
FAULT_KINDS: tuple[FaultKind, ...] = ("oom", "crash", "segfault", "hang", "actor_kill", "node_restart")


class FaultSpec(_Spec):
    """Fault injection, to test explorer itself (a chaos run); leave it out of real studies.

    First attempts get faults evenly by launch order (``rate`` of them, the kinds in turn), retries
    by a draw from ``seed`` and the trial number (:func:`explorer.fault.pick_fault`). The faults are real on the Ray launcher and simulated on the
    replay launcher (see :mod:`explorer.fault`):

    * ``oom``: every rank allocates far more than the device holds (a real allocator failure);
    * ``crash``: rank 0 exits with status 17; ``segfault``: rank 0 dereferences a null pointer;
    * ``hang``: every rank sleeps until the trial timeout kills the process group;
    * ``actor_kill``: the launcher kills the trial's Ray actor ``kill_after_s`` after it started;
    * ``node_restart``: ``kill_after_s`` after the trial started, the launcher shuts its local
      Ray down and starts it again; every trial running then is lost.
    """

    rate: float = Field(default=0.0, ge=0.0, le=1.0, strict=True)
    """Share of launched first attempts given a fault (every ``1/rate``-th, the kinds in turn)."""
    schedule: dict[NonNegativeInt, FaultKind] = Field(default_factory=dict)
    """Trial number -> the fault its first attempt gets, whatever ``rate`` draws (a test's plan)."""
    retry_rate: float = Field(default=0.0, ge=0.0, le=1.0, strict=True)
    """Share of retries (attempt 2 and later) given a fault, so that some run out of retries."""
    kinds: list[FaultKind] = Field(default_factory=lambda: list(FAULT_KINDS), min_length=1)
    """The faults to inject, in turn."""
    seed: Int = 0
    at_step: NonNegativeInt = 1
    """Worker faults strike as this optimizer step begins (0: the first), after the model is built."""
    kill_after_s: PositiveFloat = 2.0
    """``actor_kill``/``node_restart``: seconds after the trial started (virtual seconds on replay)."""


_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}
_HOURS = {"": 1.0, "h": 1.0, "m": 1 / 60, "min": 1 / 60, "d": 24.0, "s": 1 / 3600}


def parse_amount(text: object, *, units: dict[str, float] = _SCALE) -> float:
    """A positive number, perhaps with a unit suffix: ``2e9``, ``2B`` and ``2G`` are 2,000,000,000
    tokens; with ``units=`` hours' suffixes, ``36h``, ``1.5d`` and ``90m`` are hours.

    Raises:
        ValueError: not a positive finite number with one of the suffixes.
    """
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise ValueError(f"{text!r} is not a number")
    match = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if match is None or match.group(2) not in units:
        suffixes = ", ".join(k for k in units if k)
        raise ValueError(f"{text!r} is not a number (suffixes: {suffixes})")
    value = float(match.group(1)) * units[match.group(2)]
    if not 0 < value < float("inf"):
        raise ValueError(f"{text!r} must be positive")
    return value


def parse_hours(text: object) -> float:
    """Hours from ``36``, ``36h``, ``1.5d``, ``90m`` (see :func:`parse_amount`)."""
    return parse_amount(text, units=_HOURS)


Tokens = Annotated[float, BeforeValidator(parse_amount)]
Hours = Annotated[float, BeforeValidator(parse_hours)]


class BudgetSpec(_Spec):
    """The real fine-tune the study prepares for: ``explorer plan`` predicts its time and cost from
    the study's trials (each value can be given on its command line instead)."""

    tokens: Tokens
    """Dataset tokens in one epoch of the real run (``2e9``, ``2B`` or ``2000000000``)."""
    epochs: PositiveFloat = 1.0
    """Passes over the dataset."""
    deadline_hours: Hours | None = None
    """Wall-clock hours the run must finish in (``explorer plan`` marks the cheapest that does)."""
    max_gpus: PositiveInt | None = None
    """Most GPUs the real run may hold; beyond the largest measured count, ``explorer plan``
    extrapolates with its scaling fit (marked as such). ``None``: the largest measured count."""
    global_batch: PositiveInt | None = None
    """Samples per optimizer step that the real run's recipe fixes (the batch over all GPUs times
    gradient accumulation): ``explorer plan`` plans only configurations that keep it.
    ``None``: any (an extrapolated row keeps the per-device batch, so its global batch grows)."""

    @property
    def total_tokens(self) -> float:
        """Dataset tokens over every epoch."""
        return self.tokens * self.epochs


class StudySpec(_Spec):
    """A whole study file."""

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[\w.-]+$")
    """Study name in the storage; also a folder and file name (``explorer-runs/<name>``,
    ``<name>.db``, ``<name>.csv``), so letters, digits, ``_``, ``.`` and ``-`` only, not
    starting with ``.`` (``..`` would name the folder above), and short enough for a file name."""
    storage: str | None = None
    """SQLAlchemy URL. Default: ``sqlite:///<study file dir>/<name>.db``."""
    output_dir: NonEmptyStr | None = None
    """The run folder (trial folders and logs, write-ahead files, report, ``best`` files).
    Default: ``explorer-runs/<name>`` next to the study file for the file's own storage,
    ``explorer-runs/<name>.<storage>-<hash>`` for another (:func:`explorer.paths.default_output_dir`)."""
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    n_trials: PositiveInt = 20
    timeout_s: PositiveFloat | None = None
    """Stop launching new trials after this many seconds of this run."""
    parallel_trials: PositiveInt = 1
    """Trials in flight at once, as far as the GPUs allow (trials asked and waiting for GPUs
    count too)."""
    lookahead: PositiveInt = 4
    """Asked trials that may wait for GPUs at once. While GPUs are free and none of them fits,
    the driver asks for another; the oldest that fits starts first (first fit). ``1``: trials
    start strictly in the order asked (no packing)."""
    max_passed_over: NonNegativeInt = 8
    """Times younger waiting trials may start ahead of the oldest one; after that nothing else
    starts until it fits, so a large trial is never starved by a stream of small ones."""
    objective: FirstObjective = OBJECTIVE
    """What the study optimizes: one of the objectives declared in
    :data:`explorer.spec._objectives.OBJECTIVE_TABLE` that may stand first (maximized or minimized
    as declared there). A stored study keeps the objective it was created with."""
    second_objective: SecondObjective | None = None
    """Besides ``objective``: a second objective from the same table, which makes the study
    multi-objective (Optuna's Pareto front, ``study.best_trials``). An infeasible trial gets the
    worst value of each objective (0, or 1e9 when minimized) and its real GPU count; local search
    climbs on the first objective."""
    when_converged: Literal["stop", "explore"] = "stop"
    """When the sampler keeps proposing configurations already answered: ``stop`` after 30 such
    proposals in a row (the study has nothing new to try); ``explore``: after one, run an
    unanswered configuration of the space at random, so that ``n_trials`` distinct ones are spent
    (stopping only when none is left)."""
    infer_oom: bool = True
    """Record a configuration that needs at least the memory of a known OOM (larger per-device
    batch, longer sequences, checkpointing off, less sharding, fewer GPUs under sharding; all else
    equal) as OOM without running it, citing that trial (``inferred_from``)."""
    reuse_measurements: bool = True
    """Answer a configuration already measured (ok or oom) with the same workload on the same
    hardware, by this study or any other in the same storage, from the measurement store
    (``reused_from_store``) instead of running it; ``false``: always run, and store nothing.
    See :mod:`explorer.store` for what "the same" holds."""
    prices: dict[NonEmptyStr, PositiveFloat] = Field(default_factory=dict)
    """USD per GPU-hour, by GPU model (``resources.gpu_model``): ``explorer plan`` costs each
    configuration with them (``--price MODEL=USD`` overrides one)."""
    budget: BudgetSpec | None = None
    """The real run's token budget, deadline and GPU limit, for ``explorer plan``."""
    memory_margin: float = Field(default=0.05, ge=0, lt=1)
    """The headroom a winner should leave below its memory limit (``device_memory_gib``, else the
    device's memory), as a fraction of it: ``explorer best``, ``report`` and ``plan`` flag a best
    configuration whose peak comes closer, and name the best one that leaves this much."""
    confirm_budget_gpu_s: float | None = Field(default=None, ge=0)
    """GPU-seconds ``optimize`` may spend, after ``n_trials``, re-measuring the configurations
    within noise of the best (interleaved, A B C A B C ...) until the best separates or this is
    spent; the verdict (``confirmed``, or ``tied`` with the most robust one recommended) is what
    ``best``, ``report`` and ``plan`` say. ``null``: a quarter of the GPU-seconds the study's
    trials took (none where every one was answered from the measurement store); ``0``: never
    re-measure. Confirmations never count towards ``n_trials``."""
    workload: WorkloadSpec
    measurement: MeasurementSpec = Field(default_factory=MeasurementSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    launcher: LauncherSpec = Field(default_factory=RayLauncherSpec)
    faults: FaultSpec | None = None
    """Fault injection, for testing explorer (see :class:`FaultSpec`)."""
    search_space: str | dict[str, Any]
    """A file under ``search_spaces/`` (relative to the study file) or the domains inline."""

    @field_validator("name")
    @classmethod
    def _not_a_path_step(cls, value: str) -> str:
        if value.startswith("."):
            raise ValueError(
                f"{value!r} starts with '.': the name is also a folder name ('..' is the parent)"
            )
        return value

    @field_validator("search_space", mode="before")
    @classmethod
    def _file_or_mapping(cls, value: Any) -> Any:
        # Checked here so that the error names ``search_space``, not a union member ("search_space.str").
        if not isinstance(value, (str, dict)):
            raise ValueError("give a search-space file name or a mapping with 'parameters'")
        return value

    @model_validator(mode="after")
    def _check_objectives(self) -> StudySpec:
        chosen = {self.objective, self.second_objective}
        if self.objective == self.second_objective:
            raise ValueError(f"second_objective: {self.objective} is already the objective")
        needs = {o.needs: o.name for o in OBJECTIVE_TABLE if o.name in chosen and o.needs}
        models = [self.resources.gpu_model, *(self.resources.gpu_models or {})]
        unpriced = [m for m in dict.fromkeys(models) if m is not None and m not in self.prices]
        if "prices" in needs and unpriced:
            raise ValueError(
                f"prices: {needs['prices']} needs a price for {unpriced[0]!r} "
                f"(USD per GPU-hour), e.g. prices: {{{unpriced[0]}: 4.0}}"
            )
        if "budget" in needs and self.budget is None:
            raise ValueError(
                f"budget: {needs['budget']} needs budget.tokens (and epochs), e.g. budget: {{tokens: 2e9}}"
            )
        return self

    @model_validator(mode="after")
    def _check_faults(self) -> StudySpec:
        address = self.launcher.address if isinstance(self.launcher, RayLauncherSpec) else None
        if self.faults is not None and "node_restart" in self.faults.kinds and address:
            raise ValueError(
                "faults: node_restart restarts the local Ray; it cannot restart a cluster at launcher.address"
            )
        return self
