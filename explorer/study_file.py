"""Load a study file: the typed spec (:mod:`explorer.spec`) resolved against the search space
(:mod:`explorer.space`), the resources (:mod:`explorer.validity`), the replay table and the Ray
cluster (:mod:`explorer.launch`). Nothing is written anywhere.

This sits above those packages so that :mod:`explorer.spec` stays a leaf: the pydantic models
and the safe YAML reader, importing nothing of explorer's but errors, paths and secrets.
"""

from __future__ import annotations

from pathlib import Path

from explorer.errors import SpecError, did_you_mean
from explorer.hardware import with_gpu_model
from explorer.launch import launcher_kind
from explorer.space import SearchSpace
from explorer.spec import LoadedStudy, StudySpec
from explorer.spec._load import (
    dataset_path_of,
    model_path_of,
    space_source,
    storage_and_run_folder,
    study_spec,
)
from explorer.validity import invalid_reason, invalid_reasons

__all__ = ["load_study"]


def load_study(
    path: str | Path,
    *,
    storage: str | None = None,
    n_trials: int | None = None,
    replay_table: str | Path | None = None,
    check_model: bool = True,
    check_launcher: bool | None = None,
    check_hub: bool | None = None,
) -> LoadedStudy:
    """Read and validate a study file and everything it points to.

    Nothing is written anywhere. Command-line overrides are applied and validated too.

    Args:
        check_model: build the model architecture's transformers config to check it (imports
            transformers, about 2.5 s); the commands that only read a stored study skip it.
        check_launcher: probe what the launcher points to (a Ray cluster address, ``launcher.address``
            or ``RAY_ADDRESS``, with a TCP connect of a few seconds); default: as ``check_model``
            (the commands that only read a stored study do not need the cluster).
        check_hub: require a hub model id to be in the local cache or reachable (a request of a
            few seconds at most); default: as ``check_launcher``.

    Raises:
        SpecError: the first problem found, naming the file and the field.
    """
    file = Path(path)
    label = str(path)
    spec, file_storage = study_spec(file, storage=storage, n_trials=n_trials, replay_table=replay_table)
    base = file.resolve().parent
    storage_url, output_dir = storage_and_run_folder(
        spec, label, base, file_storage=file_storage, from_cli=storage is not None
    )
    probe = check_model if check_launcher is None else check_launcher
    spec, _ = with_gpu_model(
        spec, label, probe=probe, stored=lambda: _stored_gpu_model(storage_url, spec.name)
    )
    space_label, space_raw = space_source(spec, label, base)
    space = SearchSpace.from_raw(
        space_raw,
        file=space_label,
        workload=spec.workload,
        check_transformers=check_model,
        device=spec.resources.device,
    )
    if check_model and spec.workload.training_arguments:
        from explorer.passthrough import check_training_arguments

        check_training_arguments(spec.workload.training_arguments, file=label)
    model_path = model_path_of(
        spec, label, base, check_model=check_model, probe_hub=probe if check_hub is None else check_hub
    )
    dataset_path = dataset_path_of(spec, label, base, model_path=model_path)
    _check_gpu_models(spec, space, label=label, space_label=space_label)
    _refuse_all_invalid(spec, space, space_label)
    _refuse_never_valid_values(spec, space, space_label)
    _refuse_trl_values(spec, space, space_label)
    table = launcher_kind(spec).check(spec, label=label, base=base, space=space, probe=probe)
    if check_model and probe:  # validate --offline checks a study meant for another machine
        _check_local_cuda(spec, label)
    return LoadedStudy(
        spec=spec,
        space=space,
        file=file,
        storage_url=storage_url,
        output_dir=output_dir,
        model_path=model_path,
        dataset_path=dataset_path,
        replay_table=table,
    )


def _stored_gpu_model(storage_url: str, name: str) -> str | None:
    """The GPU model stored with the study (its identity), for a command that only reads it."""
    from explorer.study._identity import stored_identity

    model = (stored_identity(storage_url, name) or {}).get("resources.gpu_model")
    return model if isinstance(model, str) else None


def _check_local_cuda(spec: StudySpec, label: str) -> None:
    """``device: cuda`` with a local launcher (no cluster address): the trials run on this
    machine, which must have a CUDA GPU."""
    if spec.resources.device != "cuda" or not launcher_kind(spec).local(spec):
        return
    import torch

    if not torch.cuda.is_available():
        raise SpecError(
            file=label,
            field="resources.device",
            problem="cuda, but this machine has no CUDA GPU (torch.cuda.is_available() is false) and the "
            "local launcher runs the trials here: use device: cpu or auto, or a Ray cluster (launcher.address)",
        )


def _check_gpu_models(spec: StudySpec, space: SearchSpace, *, label: str, space_label: str) -> None:
    """Every ``gpu_model`` the space may take is a declared one (``resources.gpu_models``, else
    ``resources.gpu_model``); what else a launcher needs of them is its own check."""
    declared = spec.resources.models
    domain = space.domains.get("gpu_model")
    for value in domain.values if domain is not None else ():
        if value not in declared:
            where = "resources.gpu_models" if spec.resources.gpu_models else "resources.gpu_model"
            raise SpecError(
                file=space_label,
                field="parameters.gpu_model",
                problem=f"{value!r} is not a GPU model of {where} ({', '.join(declared)})"
                + did_you_mean(str(value), list(declared)),
            )


def _refuse_all_invalid(spec: StudySpec, space: SearchSpace, space_label: str) -> None:
    """Every configuration invalid on the resources? Then no study is worth starting."""
    reasons: dict[str, int] = {}
    for i, config in enumerate(space.enumerate()):
        reason = invalid_reason(config, spec.resources)
        if reason is None:
            return
        key = reason.split(" ")[0] + " ..." if len(reasons) > 3 else reason
        reasons[key] = reasons.get(key, 0) + 1
        if i > 200_000:
            return
    example = next(iter(reasons), "the space is empty")
    raise SpecError(
        file=space_label,
        field="parameters",
        problem=f"every configuration is invalid on these resources (e.g. {example})",
    )


def _refuse_trl_values(spec: StudySpec, space: SearchSpace, space_label: str) -> None:
    """``workload.trainer: trl``: the first searched value TRL's ``SFTConfig`` cannot express
    (:func:`explorer.settings.trl_refusal`), in one line."""
    if spec.workload.trainer != "trl":
        return
    from explorer.settings import trl_refusal

    for name, domain in space.domains.items():
        for value in domain.values:
            reason = trl_refusal(name, value)
            if reason is not None:
                raise SpecError(file=space_label, field=f"parameters.{name}", problem=reason)


NEVER_VALID_LIMIT = 100_000
"""Largest space (product of its domains) whose every configuration is looked at for values that
can never run; a larger one is not checked (a few seconds per 100,000 configurations)."""


def _refuse_never_valid_values(spec: StudySpec, space: SearchSpace, space_label: str) -> None:
    """Each searched value that no valid configuration of the space takes (a sharding strategy no
    searched FSDP version has, a GPU count above the resources), by the validity rules
    (:func:`explorer.validity.invalid_reasons`) and the knobs' conditions (a value shows only in
    the configurations where its knob applies): one line for the first, naming the rule every
    configuration with it breaks, and how many other values there are."""
    searched = {name: d.values for name, d in space.domains.items() if len(d.values) > 1}
    if not searched or space.size > NEVER_VALID_LIMIT:
        return
    never: dict[tuple[str, object], list[str] | None] = {
        (n, v): None for n, vs in searched.items() for v in vs
    }
    for config in space.enumerate():
        values = config.to_dict()
        reasons = list(invalid_reasons(config, spec.resources))
        for name in searched:
            key = (name, values.get(name))
            if key not in never:
                continue
            if not reasons:
                del never[key]
                continue
            seen = never[key]  # the rules every configuration with this value broke so far
            never[key] = reasons if seen is None else [r for r in seen if r in reasons]
        if not never:
            return
    (name, value), common = next(iter(never.items()))
    reason = (common or ["no valid configuration of the space takes it"])[0]
    others = ", ".join(f"{n} {v}" for n, v in list(never)[1:])
    raise SpecError(
        file=space_label,
        field=f"parameters.{name}",
        problem=f"{value} can never run: {reason}; remove it"
        + (f" (never either: {others})" if others else ""),
    )
