"""What optuna-dashboard shows of a study besides Optuna's own records.

* Study user attrs (:func:`study_attrs`): the model, method, dataset, hardware (GPU model, device,
  device memory) and launcher, from the study file, written when ``optimize`` creates or opens the
  study (only those that changed). The dashboard lists them on the study page.
* A study note (Markdown, the dashboard's "Note" box): the same facts, and how to read the study
  there; written once, so that an edit made in the dashboard is kept.
* A note per finished trial (:func:`trial_note`): its outcome and its configuration in user units.
  Optuna's parameters are encodings that let TPE search an ordered domain (see
  :class:`explorer.space._domain.Ordered`): ``log2_batch_size`` 3 is batch size 8,
  ``<knob>_index`` a position in the listed values. Changing them would change every search's
  trial sequence (pinned by ``tests/test_search_sequences.py``), so the dashboard is told the user
  units instead: in this note, and in the ``batch_size``-style user attrs (the dashboard's trial
  table offers them as ``UserAttribute`` columns).

The notes go through optuna-dashboard's own ``save_note`` (study system attrs
``dashboard:...``); without optuna-dashboard installed (the ``dashboard`` extra) no note is
written, and the user attrs still say everything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from explorer.record import Key, StudyRecord, TrialRecord, infeasibility, write_study
from explorer.study._objectives import OBJECTIVE, OBJECTIVES, SECOND_OBJECTIVES, metric_names
from explorer.trial_config import field_names

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy

__all__ = [
    "describe_study",
    "param_in_user_units",
    "study_attrs",
    "study_note",
    "trial_note",
    "write_trial_note",
]

MAX_NOTE_ERROR_CHARS = 600
"""Of a trial's error, what its note quotes (the whole text is the ``error`` user attr)."""


def _dashboard() -> Any:
    """optuna-dashboard's package, or ``None`` where it is not installed."""
    try:
        import optuna_dashboard
    except ImportError:
        return None
    return optuna_dashboard


def param_in_user_units(name: str, value: Any, attrs: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The knob and its value in user units for the Optuna parameter ``name`` (``None``: the
    parameter is the knob itself). ``attrs``: the trial's user attrs, which hold the configuration."""
    for knob in (name.removeprefix("log2_"), name.removesuffix("_index")):
        if knob != name and knob in attrs:
            return knob, attrs[knob]
    return None


def _fenced(text: str) -> str:
    """``text`` in a Markdown code block that no run of backticks inside it can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|")


def trial_note(trial: optuna.trial.FrozenTrial, metric_names: list[str] | None = None) -> str:
    """The Markdown note of a finished trial: outcome, then configuration in user units."""
    record = TrialRecord.of(trial)
    attrs = record.attrs
    status = record.status or trial.state.name.lower()
    lines = [f"### Trial {trial.number}: {status}", ""]
    values = trial.values
    if status == "ok" and values:
        names = metric_names or [OBJECTIVE]
        lines.append(", ".join(f"{name} **{v:,.6g}**" for name, v in zip(names, values, strict=False)))
        if record.has(Key.PEAK_MEMORY_GIB):
            lines[-1] += f"; peak memory {float(record[Key.PEAK_MEMORY_GIB]):.3g} GiB"
    elif infeasibility(trial) > 0:
        lines.append(
            f"**Infeasible** ({status}): the value {', '.join(f'{v:g}' for v in values or [])} is a "
            "placeholder that keeps the sampler learning, not a measurement."
        )
    elif status in ("failed", "retry"):
        lines.append(
            f"**Failed** ({status}): not measured" + (", run again" if status == "retry" else "") + "."
        )
    if record.reused_from is not None:
        lines.append(f"Answered from trial {record.reused_from} (the same configuration), not run.")
    elif record.inferred_from is not None:
        lines.append(f"Inferred, not run: it needs at least the memory of trial {record.inferred_from}.")
    elif (stored := record.reused_from_store) is not None:
        lines.append(
            f"Answered from the measurement store: study {stored.get('study')!r}, trial {stored.get('trial')}."
        )
    if record.error and not record.answered_without_running:
        lines += ["", _fenced(record.error[:MAX_NOTE_ERROR_CHARS])]

    searched: dict[str, str] = {}
    for name, value in trial.params.items():
        decoded = param_in_user_units(name, value, attrs)
        knob = decoded[0] if decoded else name
        searched[knob] = f"`{name}` = {value}" if decoded else "searched"
    rows = [
        (knob, attrs[knob], searched.get(knob, "fixed"))
        for knob in field_names()
        if attrs.get(knob) is not None
    ]
    rows += [(knob, trial.params[knob], how) for knob, how in searched.items() if knob not in attrs]
    lines += ["", "| knob | value | Optuna parameter |", "|---|---|---|"]
    lines += [f"| {_cell(k)} | {_cell(v)} | {_cell(how)} |" for k, v, how in rows]
    return "\n".join(lines) + "\n"


def write_trial_note(study: optuna.Study, trial: optuna.Trial, stored: optuna.trial.FrozenTrial) -> None:
    """Save the note of ``trial``, just finished (``stored``: as ``study.tell`` returned it), where
    optuna-dashboard reads it; not for a study in memory, which no dashboard can open
    (benchmark-search's runs: a note is a quarter of a replayed trial's time)."""
    import optuna

    dashboard = _dashboard()
    if dashboard is None or isinstance(study._storage, optuna.storages.InMemoryStorage):
        return
    names = metric_names(study) if len(study.directions) > 1 else None
    body = trial_note(stored, names)
    if not _save_note_at_once(study, stored._trial_id, body):
        dashboard.save_note(trial, body)


def _save_note_at_once(study: optuna.Study, trial_id: int, body: str) -> bool:
    """Write a trial's note as optuna-dashboard's ``save_note`` does (study system attrs: the
    version, one more than before, and the text in chunks, a stale chunk emptied), in one
    transaction that reads only this trial's note keys (``save_note`` reads every study system
    attr twice, notes of every trial included, and commits each key). ``False``: not an RDB
    storage (or an Optuna without the private session helper): nothing written."""
    from optuna.storages import RDBStorage

    backend = getattr(study._storage, "_backend", study._storage)  # _CachedStorage wraps RDB
    if not isinstance(backend, RDBStorage):
        return False
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
        from optuna_dashboard._note import note_str_key_prefix, note_ver_key, split_body
    except ImportError:
        return False
    model = models.StudySystemAttributeModel
    mine = f"dashboard:{trial_id}:"  # every key of this trial's note, and no other trial's
    with _create_scoped_session(backend.scoped_session) as session:
        rows: dict[str, Any] = {
            str(row.key): row
            for row in session.query(model).filter(
                model.study_id == study._study_id, model.key >= mine, model.key < mine[:-1] + ";"
            )
        }
        version = rows.get(note_ver_key(trial_id))
        chunks = split_body(body, trial_id)
        prefix = note_str_key_prefix(trial_id)
        stale = sum(key.startswith(prefix) for key in rows) - len(chunks)
        chunks.update({f"{prefix}{len(chunks) + i}": "" for i in range(max(stale, 0))})
        before = int(json.loads(str(version.value_json))) if version is not None else 0
        values: dict[str, Any] = {note_ver_key(trial_id): before + 1, **chunks}
        for key, value in values.items():
            if key in rows:
                rows[key].value_json = json.dumps(value)
            else:
                session.add(model(study_id=study._study_id, key=key, value_json=json.dumps(value)))
    return True


def _dataset(loaded: LoadedStudy) -> str:
    d = loaded.spec.workload.dataset
    if d.kind == "jsonl":
        return f"jsonl {loaded.dataset_path or d.path} (text field {d.text_field!r})"
    lengths = f"{d.min_tokens}" if d.max_tokens in (None, d.min_tokens) else f"{d.min_tokens}-{d.max_tokens}"
    shape = f", {d.lengths} lengths" if d.max_tokens not in (None, d.min_tokens) else ""
    if d.lengths == "lognormal":
        shape += f" (median {d.median_tokens}, sigma {d.sigma})"
    preset = f" ({d.preset})" if d.preset else ""
    return f"synthetic{preset}: {d.entries} entries of {lengths} tokens{shape}, seed {d.seed}"


def study_attrs(loaded: LoadedStudy) -> dict[str, Any]:
    """The study's user attrs that say what it measures and on what (from the study file)."""
    from explorer.launch import launcher_kind

    spec = loaded.spec
    w, r = spec.workload, spec.resources
    model = w.model.name + (f" ({loaded.model_path})" if loaded.model_path else "")
    if w.model.architecture and w.model.architecture.get("model_type"):
        model += f", {w.model.architecture['model_type']} built from its config"
    method: str = w.method.kind
    if method == "lora":
        method += f" (r {w.method.r}, alpha {w.method.alpha}, {', '.join(w.method.target_modules)})"
    launcher = launcher_kind(spec).describe(loaded)
    objectives = f"{spec.objective} ({OBJECTIVES[spec.objective]})"
    if second := spec.second_objective:
        objectives += f", {second} ({SECOND_OBJECTIVES[second]})"
    return {
        "objectives": objectives,
        "model": model,
        "method": method,
        "dataset": _dataset(loaded),
        "model_max_length": w.model_max_length,
        "torch_dtype": w.torch_dtype,
        "gpu_model": ", ".join(f"{m}: {n} GPUs" for m, n in r.gpu_models.items())
        if r.gpu_models
        else r.gpu_model,
        "device": r.device,
        "device_memory_gib": r.device_memory_gib
        if r.device_memory_gib is not None
        else "the whole device (no cap)",
        "gpus_per_node": r.gpus_per_node,
        "nodes": r.nodes,
        "launcher": launcher,
    }


def study_note(loaded: LoadedStudy) -> str:
    """The study's Markdown note: what it measures, and how to read it in optuna-dashboard."""
    attrs = study_attrs(loaded)
    facts = "\n".join(f"- **{k}**: {v}" for k, v in attrs.items())
    return f"""## {loaded.spec.name}

The best configuration for this job by {loaded.spec.objective.replace("_", " ")} ({OBJECTIVES[loaded.spec.objective]}d), searched by explorer.

{facts}

### Reading this study here

- **Infeasible trials**: a configuration that ran out of memory (`oom`) or cannot run (`invalid`)
  is *Complete* with the placeholder value 0 and a constraint above 0, so that Optuna's samplers
  learn from it. The plots show it as *Infeasible* (grey); its note and its `status` and `error`
  user attributes say why.
- **Parameters** are Optuna's encodings: `log2_<knob>` is the knob's log2 (`log2_batch_size` 3 is
  batch size 8), `<knob>_index` a position in the listed values. Each trial's note, and its user
  attributes (the trial table's `UserAttribute` columns), give the values in user units.
- **Hyperparameter importance** here counts the infeasible trials' placeholder zeros (the dashboard
  computes it on every Complete trial). For importances over the feasible trials only, run
  `explorer report {loaded.file}`.
"""


def describe_study(study: optuna.Study, loaded: LoadedStudy) -> None:
    """Write :func:`study_attrs` (those that changed) and, where the study has none yet, the study
    note (with optuna-dashboard installed)."""
    current = StudyRecord.of(study)
    for key, value in study_attrs(loaded).items():
        if current.get(key) != value:
            write_study(study, key, value)
    dashboard = _dashboard()
    if dashboard is not None and not dashboard.get_note(study):
        dashboard.save_note(study, study_note(loaded))
