"""The search space: domains for the tuning knobs, with the conditional structure built in.

``distributed_backend`` and ``number_nodes`` exist only when more than one GPU is chosen;
``fsdp_version`` and ``fsdp_sharding_strategy`` exist only when the backend is FSDP.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError
from explorer.space._domain import Domain, Fixed, Value, parse_domain
from explorer.trial_config import BACKENDS, FSDP_SHARDING_STRATEGIES, FSDP_VERSIONS, TrialConfig

if TYPE_CHECKING:
    import optuna

    from explorer.spec import WorkloadSpec

__all__ = ["PARAMETERS", "SearchSpace"]


@dataclass(frozen=True)
class _Param:
    kind: str
    check: Callable[[Value], str | None]
    doc: str
    check_transformers: Callable[[Value], str | None] | None = None
    """A check that imports transformers (seconds): run only where the model is checked too
    (``validate``, ``optimize``, ``measure``), not by the commands that read a stored study."""


def _positive(v: Value) -> str | None:
    return None if isinstance(v, int) and v > 0 else f"{v!r} must be a positive integer"


def _one_of(allowed: tuple[Value, ...]) -> Callable[[Value], str | None]:
    return lambda v: None if v in allowed else f"{v!r} is not one of {list(allowed)}"


def _any(v: Value) -> str | None:
    return None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean X"`` for the known name closest to ``name`` (case ignored), or ``""``."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[close[0]]}" if close else ""


def _optimizer(v: Value) -> str | None:
    from transformers.training_args import OptimizerNames

    known = [o.value for o in OptimizerNames]
    if v in known:
        return None
    return f"{v!r} is not a transformers optimizer (TrainingArguments.optim){did_you_mean(str(v), known)}"


PARAMETERS: dict[str, _Param] = {
    "batch_size": _Param("int", _positive, "global batch, spread evenly over the GPUs"),
    "number_gpus": _Param("int", _positive, "GPUs (processes) per trial"),
    "number_nodes": _Param("int", _positive, "nodes the GPUs are spread over (only when number_gpus > 1)"),
    "distributed_backend": _Param("str", _one_of(BACKENDS), "DDP or FSDP (only when number_gpus > 1)"),
    "fsdp_version": _Param("int", _one_of(FSDP_VERSIONS), "1 or 2 (only with FSDP)"),
    "fsdp_sharding_strategy": _Param(
        "str", _one_of(FSDP_SHARDING_STRATEGIES), "FSDP sharding strategy (only with FSDP)"
    ),
    "gradient_checkpointing": _Param("bool", _any, "activation checkpointing"),
    "model_max_length": _Param("int", _positive, "sequence length (default: the workload's)"),
    "gradient_accumulation_steps": _Param("int", _positive, "micro-steps per optimizer step"),
    "lora_r": _Param("int", _positive, "LoRA rank (LoRA workloads only)"),
    "optim": _Param("str", _any, "TrainingArguments.optim", check_transformers=_optimizer),
    "torch_compile": _Param("bool", _any, "torch.compile the model"),
}
REQUIRED = ("batch_size", "number_gpus", "gradient_checkpointing")


@dataclass(frozen=True)
class SearchSpace:
    """Domains for every knob, resolved against the workload's defaults."""

    domains: dict[str, Domain]
    lora: bool

    @classmethod
    def from_raw(
        cls, raw: Any, *, file: str, workload: WorkloadSpec, check_transformers: bool = False
    ) -> SearchSpace:
        """Validate a search-space mapping (``{parameters: {...}}``) and fill in defaults.

        Args:
            check_transformers: also run the checks that import transformers (the optimizer
                names), a few seconds.

        Raises:
            SpecError: naming ``file`` and the offending field.
        """

        def fail(field: str, problem: str) -> SpecError:
            return SpecError(file=file, field=field, problem=problem)

        if not isinstance(raw, dict):
            raise fail("", "a search space must be a mapping with a 'parameters' key")
        extra = set(raw) - {"parameters", "description"}
        if extra:
            raise fail(sorted(map(str, extra))[0], "unknown key (allowed: parameters, description)")
        if not isinstance(raw.get("description", ""), str):
            raise fail("description", "must be text")
        params = raw.get("parameters")
        if not isinstance(params, dict) or not params:
            raise fail("parameters", "missing or empty; give a mapping of parameter domains")
        domains: dict[str, Domain] = {}
        for name, value in params.items():
            field = f"parameters.{name}"
            spec = PARAMETERS.get(str(name))
            if spec is None:
                hint = did_you_mean(str(name), PARAMETERS)
                raise fail(field, f"unknown parameter{hint}; known: {', '.join(PARAMETERS)}")
            try:
                domain = parse_domain(value, kind=spec.kind)
            except ValueError as exc:
                raise fail(field, str(exc)) from None
            for v in domain.values:
                problem = spec.check(v)
                if problem is None and check_transformers and spec.check_transformers is not None:
                    problem = spec.check_transformers(v)
                if problem:
                    raise fail(field, problem)
            domains[str(name)] = domain
        for name in REQUIRED:
            if name not in domains:
                raise fail(f"parameters.{name}", "required parameter is missing")

        gpus = domains["number_gpus"].values
        multi = any(int(g) > 1 for g in gpus)
        if multi and "distributed_backend" not in domains:
            raise fail("parameters.distributed_backend", "required when number_gpus can exceed 1")
        if not multi and "distributed_backend" in domains:
            raise fail(
                "parameters.distributed_backend",
                "contradicts number_gpus: DDP and FSDP need number_gpus > 1, but number_gpus is only 1",
            )
        if not multi and any(int(v) > 1 for v in domains.get("number_nodes", Fixed(1)).values):
            raise fail(
                "parameters.number_nodes",
                "contradicts number_gpus: more than one node needs number_gpus > 1, but number_gpus is only 1",
            )
        fsdp = "FSDP" in domains.get("distributed_backend", Fixed("NONE")).values
        for name in ("fsdp_version", "fsdp_sharding_strategy"):
            if fsdp and name not in domains:
                raise fail(f"parameters.{name}", "required when distributed_backend can be FSDP")
            if not fsdp and name in domains:
                raise fail(f"parameters.{name}", "set, but distributed_backend is never FSDP")
        lora = workload.method.kind == "lora"
        if "lora_r" in domains and not lora:
            raise fail("parameters.lora_r", "set, but the workload's method is not lora")
        domains.setdefault("number_nodes", Fixed(1))
        domains.setdefault("model_max_length", Fixed(workload.model_max_length))
        domains.setdefault("gradient_accumulation_steps", Fixed(1))
        domains.setdefault("optim", Fixed("adamw_torch"))
        domains.setdefault("torch_compile", Fixed(False))
        if lora:
            domains.setdefault("lora_r", Fixed(workload.method.r))
        return cls(domains=domains, lora=lora)

    # -- the conditional structure, shared by suggest() and enumerate() ------------------------

    def _build(self, pick: Callable[[str], Value]) -> TrialConfig:
        gpus = int(pick("number_gpus"))
        nodes = int(pick("number_nodes")) if gpus > 1 else 1
        backend = str(pick("distributed_backend")) if gpus > 1 else "NONE"
        fsdp = backend == "FSDP"
        return TrialConfig(
            batch_size=int(pick("batch_size")),
            number_gpus=gpus,
            number_nodes=nodes,
            distributed_backend=backend,  # type: ignore[arg-type]
            fsdp_version=int(pick("fsdp_version")) if fsdp else None,
            fsdp_sharding_strategy=str(pick("fsdp_sharding_strategy")) if fsdp else None,
            gradient_checkpointing=bool(pick("gradient_checkpointing")),
            model_max_length=int(pick("model_max_length")),
            gradient_accumulation_steps=int(pick("gradient_accumulation_steps")),
            lora_r=int(pick("lora_r")) if self.lora else None,
            optim=str(pick("optim")),
            torch_compile=bool(pick("torch_compile")),
        )

    def suggest(self, trial: optuna.Trial) -> TrialConfig:
        """Ask ``trial`` for every active parameter, in the conditional order."""
        return self._build(lambda name: self.domains[name].suggest(trial, name))

    def params_for(self, config: TrialConfig) -> dict[str, Value]:
        """The Optuna parameters that encode ``config`` (the inverse of :meth:`suggest`)."""
        values = config.to_dict()
        params: dict[str, Value] = {}
        for name, domain in self.domains.items():
            value = values.get(name)
            if isinstance(domain, Fixed) or value not in domain.values:
                continue  # fixed, or inactive here (e.g. distributed_backend NONE on one GPU)
            if name == "number_nodes" and config.number_gpus == 1:
                continue  # asked only when number_gpus > 1 (one GPU is always one node)
            params.update(domain.encode(name, value))
        return params

    def enumerate(self) -> Iterator[TrialConfig]:
        """Every distinct configuration of the space (conditional parameters respected)."""
        seen: set[TrialConfig] = set()
        names = list(self.domains)
        for combo in itertools.product(*(self.domains[n].values for n in names)):
            config = self._build(dict(zip(names, combo, strict=True)).__getitem__)
            if config not in seen:
                seen.add(config)
                yield config

    @property
    def size(self) -> int:
        """Upper bound on the number of configurations (the product of the domain sizes)."""
        n = 1
        for d in self.domains.values():
            n *= len(d.values)
        return n
