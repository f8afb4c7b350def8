"""The search space: domains for the tuning knobs, with the conditional structure built in.

Every knob, its kind, checks, default and condition come from :mod:`explorer.knobs`: e.g.
``distributed_backend`` and ``number_nodes`` apply only when more than one GPU is chosen,
``fsdp_version`` and ``fsdp_sharding_strategy`` only when the backend is FSDP.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError, did_you_mean
from explorer.knobs import Knob, asking_order, knob, knobs
from explorer.space._batch import asking
from explorer.space._domain import Domain, Fixed, Value, parse_domain
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

    from explorer.spec import WorkloadSpec

__all__ = ["SearchSpace", "facts_of", "parameter_domain"]


def facts_of(workload: WorkloadSpec) -> dict[str, Any]:
    """The workload's facts that a knob's condition may name (``method``: ``full`` or ``lora``)
    or its needs read (``model_type``: of an architecture; ``None`` for a model path, whose
    type the worker learns)."""
    return {
        "method": workload.method.kind,
        "model_type": (workload.model.architecture or {}).get("model_type"),
    }


@dataclass(frozen=True)
class SearchSpace:
    """Domains for every knob, resolved against the workload's defaults."""

    domains: dict[str, Domain]
    facts: Mapping[str, Any] = field(default_factory=dict)
    """The workload's facts the knobs' conditions read (:func:`facts_of`)."""
    _enumerated: dict[str, tuple[TrialConfig, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """What :meth:`enumerate` listed, once it was gone through to the end."""

    @classmethod
    def from_raw(
        cls,
        raw: Any,
        *,
        file: str,
        workload: WorkloadSpec,
        check_transformers: bool = False,
        device: str | None = None,
    ) -> SearchSpace:
        """Validate a search-space mapping (``{parameters: {...}}``) and fill in defaults.

        Args:
            check_transformers: also run the checks that import transformers, a few seconds.
            device: the resources' device (``cpu``, ``cuda``; ``auto``/``None``: not known):
                a value that needs another is refused (:attr:`Knob.needs`).

        Raises:
            SpecError: naming ``file`` and the offending field.
        """
        params = _parameters(raw, file)
        facts = facts_of(workload)
        domains = {
            str(name): parameter_domain(
                str(name),
                value,
                file=file,
                check_transformers=check_transformers,
                device=device,
                model_type=facts["model_type"],
            )
            for name, value in params.items()
        }
        for k in knobs():
            _complete(k, domains, facts, workload, file)
        return cls(domains=domains, facts=facts)

    # -- the conditional structure, shared by suggest() and enumerate() ------------------------

    def _build(self, pick: Callable[[str], Value], order: tuple[Knob, ...] | None = None) -> TrialConfig:
        values: dict[str, Any] = {}
        for k in order or asking_order():
            if not k.applies(values, self.facts, self.domains):
                values[k.name] = k.inactive
            elif k.name in self.domains:
                values[k.name] = k.coerce(pick(k.name))
            else:  # an optional knob the space leaves out: the run's own default
                values[k.name] = k.default
        return TrialConfig(**values)

    def suggest(self, trial: optuna.Trial) -> TrialConfig:
        """Ask ``trial`` for every active parameter, in the conditional order (the parameters
        written in one transaction, the study's trials read once: :func:`asking`)."""
        with asking(trial):
            return self._build(lambda name: self.domains[name].suggest(trial, name))

    def params_for(self, config: TrialConfig) -> dict[str, Value]:
        """The Optuna parameters that encode ``config`` (the inverse of :meth:`suggest`)."""
        values = config.to_dict()
        params: dict[str, Value] = {}
        for name, domain in self.domains.items():
            value = self.asked_value(name, values)
            if isinstance(domain, Fixed) or value not in domain.values:
                continue  # fixed, or inactive here (e.g. distributed_backend NONE on one GPU)
            if not knob(name).applies(values, self.facts, self.domains):
                continue  # not asked here (number_nodes on one GPU: always one node)
            params.update(domain.encode(name, value))
        return params

    def contains(self, config: TrialConfig) -> bool:
        """Whether ``config`` is one of this space's configurations: every knob that applies to it
        takes a value its domain has (a study whose space was narrowed since holds trials outside)."""
        values = config.to_dict()
        for name, domain in self.domains.items():
            if not knob(name).applies(values, self.facts, self.domains):
                continue
            if self.asked_value(name, values) not in domain.values:
                return False
        return True

    def asked_value(self, name: str, values: Mapping[str, Any]) -> Any:
        """The value of ``name``'s domain that a configuration of ``values`` was asked for: its
        own, or the one that settles to it (:attr:`~explorer.knobs.Knob.settle`: ``DDP`` for
        the ``NONE`` of one GPU, where the backend is asked)."""
        value = values.get(name)
        settle = knob(name).settle
        if settle is None or value in self.domains[name].values:
            return value
        return next((v for v in self.domains[name].values if settle(v, values) == value), value)

    def enumerate(self) -> Iterator[TrialConfig]:
        """Every distinct configuration of the space (conditional parameters respected), in the
        order of the domains' product. Kept once a caller has gone through them all, so that the
        next one (local search's start-up probes, explore, the replay check) does not build every
        combination again; a caller that stops early (a space too large to list) keeps nothing."""
        kept = self._enumerated.get("all")
        if kept is not None:
            yield from kept
            return
        seen: dict[TrialConfig, None] = {}
        names = list(self.domains)
        order = asking_order()
        for combo in itertools.product(*(self.domains[n].values for n in names)):
            config = self._build(dict(zip(names, combo, strict=True)).__getitem__, order)
            if config not in seen:
                seen[config] = None
                yield config
        self._enumerated["all"] = tuple(seen)

    @property
    def size(self) -> int:
        """Upper bound on the number of configurations (the product of the domain sizes)."""
        n = 1
        for d in self.domains.values():
            n *= len(d.values)
        return n


def _parameters(raw: Any, file: str) -> dict[Any, Any]:
    """The ``parameters`` mapping of a search-space mapping, its shape checked."""
    if not isinstance(raw, dict):
        raise SpecError(
            file=file, field="", problem="a search space must be a mapping with a 'parameters' key"
        )
    extra = set(raw) - {"parameters", "description"}
    if extra:
        raise SpecError(
            file=file,
            field=sorted(map(str, extra))[0],
            problem="unknown key (allowed: parameters, description)",
        )
    if not isinstance(raw.get("description", ""), str):
        raise SpecError(file=file, field="description", problem="must be text")
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SpecError(
            file=file, field="parameters", problem="missing or empty; give a mapping of parameter domains"
        )
    return params


def parameter_domain(
    name: str,
    value: Any,
    *,
    file: str,
    check_transformers: bool,
    field: str | None = None,
    device: str | None = None,
    model_type: str | None = None,
) -> Domain:
    """The domain of parameter ``name`` (a YAML value), every value checked against its knob
    and against what it needs of ``device`` and ``model_type`` (``None``: not known).

    Raises:
        SpecError: at ``field`` (default ``parameters.<name>``): an unknown knob (with a did you
            mean), a malformed domain, a value of the wrong kind, one the knob's checks refuse,
            or one the device or model cannot run.
    """
    field_ = field or f"parameters.{name}"
    names = [k.name for k in knobs()]
    if name not in names:
        raise SpecError(
            file=file,
            field=field_,
            problem=f"unknown parameter{did_you_mean(name, names)}; known: {', '.join(names)}",
        )
    k = knob(name)
    try:
        domain = parse_domain(value, kind=k.kind)
    except ValueError as exc:
        raise SpecError(file=file, field=field_, problem=str(exc)) from None
    for v in domain.values:
        problem = k.check(v)
        if problem is None and check_transformers and k.check_transformers is not None:
            problem = k.check_transformers(v)
        if problem is None:
            problem = k.unmet(v, device=device, model_type=model_type)
        if problem:
            raise SpecError(file=file, field=field_, problem=problem)
    return domain


def _may_apply(k: Knob, domains: Mapping[str, Domain], facts: Mapping[str, Any]) -> bool:
    """Whether ``k`` applies for some value its condition's parent can take in ``domains``."""
    if k.when is None:
        return True
    parent = k.when.parent
    if parent in domains:
        values: tuple[Any, ...] = domains[parent].values
        if not _may_apply(knob(parent), domains, facts):
            values = (knob(parent).inactive,)
    elif parent in facts:
        values = (facts[parent],)
    else:
        values = (knob(parent).inactive,)
    return any(k.when.test(v) for v in values) or k.opened({}, domains)


def _complete(
    k: Knob, domains: dict[str, Domain], facts: Mapping[str, Any], workload: Any, file: str
) -> None:
    """Check ``k``'s domain against its condition, or give it its default (in place)."""
    field_ = f"parameters.{k.name}"
    may = _may_apply(k, domains, facts)
    if k.name in domains:
        if not may and any(v != k.inactive for v in domains[k.name].values):
            assert k.when is not None
            problem = f"contradicts {k.when.parent}: {k.name} needs {k.when.needs}, but {k.when.never}"
            raise SpecError(file=file, field=field_, problem=problem)
        return
    default = k.default_from(workload) if k.default_from is not None else k.default
    if default is not None and (may or k.default_from is None):
        domains[k.name] = Fixed(default)
    elif may and k.required:
        problem = "required parameter is missing" if k.when is None else f"required when {k.when.may}"
        raise SpecError(file=file, field=field_, problem=problem)
