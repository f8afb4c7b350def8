"""Read a study file into typed objects, and check what it points to (model, dataset, storage);
every problem becomes one :class:`SpecError` line. Resolving it against the search space, the
launchers and the replay table is :mod:`explorer.study_file`'s."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import json
import logging
import math
import os
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Tag, ValidationError

from explorer.errors import SpecError, did_you_mean
from explorer.paths import check_run_folder, default_output_dir, table_file
from explorer.secrets import mask_url
from explorer.spec._models import StudySpec

__all__ = [
    "LoadedStudy",
    "dataset_path_of",
    "model_path_of",
    "pydantic_error",
    "read_yaml",
    "resolve_path",
    "space_source",
    "storage_and_run_folder",
    "study_spec",
]

MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_ALIASES = 64
MAX_YAML_NODES = 100_000
"""Nodes once aliases are expanded: a few aliases of aliases can stand for millions of nodes."""


def read_yaml(path: Path, *, label: str | None = None) -> Any:
    """``yaml.safe_load`` a file, with a size limit and a pre-scan that refuses bombs.

    Raises:
        SpecError: missing file, too large, syntax error, too deep, too many aliases, too many
            nodes once aliases are expanded, or an alias inside its own anchor (a cycle).
    """
    name = label or str(path)
    if not path.is_file():
        raise SpecError(file=name, field="", problem="file does not exist")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise SpecError(file=name, field="", problem=f"file is larger than {MAX_YAML_BYTES} bytes")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        aliases = nodes = 0
        open_anchors: list[tuple[str | None, int]] = []  # open collections: anchor, nodes before it
        expanded: dict[str, int] = {}  # anchor -> nodes of the (closed) subtree it names
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                open_anchors.append((event.anchor, nodes))
                nodes += 1
                if len(open_anchors) > MAX_YAML_DEPTH:
                    raise SpecError(file=name, field="", problem=f"nesting deeper than {MAX_YAML_DEPTH}")
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, before = open_anchors.pop()
                if anchor is not None:
                    expanded[anchor] = nodes - before
            elif isinstance(event, yaml.ScalarEvent):
                nodes += 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    raise SpecError(file=name, field="", problem=f"more than {MAX_YAML_ALIASES} YAML aliases")
                if any(anchor == event.anchor for anchor, _ in open_anchors):
                    raise SpecError(
                        file=name, field="", problem=f"YAML alias *{event.anchor} is inside its own anchor"
                    )
                nodes += expanded.get(event.anchor or "", 1)
            if nodes > MAX_YAML_NODES:
                raise SpecError(
                    file=name,
                    field="",
                    problem=f"more than {MAX_YAML_NODES} YAML nodes once aliases are expanded",
                )
        _refuse_duplicate_keys(name, yaml.compose(text, Loader=yaml.SafeLoader))
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(file=name, field="", problem=f"YAML syntax error{where}: {problem}") from None


def _refuse_duplicate_keys(name: str, root: yaml.Node | None) -> None:
    """Refuse a key given twice in one mapping, at any depth (``yaml.safe_load`` keeps the last).

    Keys are compared as ``safe_load`` builds them (``0x10`` and ``16`` are the same key); the
    explicit keys after a merge (``<<: *base``) override the merged ones, as YAML means them to.
    """
    constructor = yaml.constructor.SafeConstructor()
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    seen: set[int] = set()  # an aliased node is walked once
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first_line: dict[Any, str] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    stack.append((value_node, path))
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a list or mapping as a key: safe_load refuses it with its own error
                key = constructor.construct_object(key_node)
                field = f"{path}.{key}" if path else str(key)
                mark = key_node.start_mark
                where = f"line {mark.line + 1}, column {mark.column + 1}"
                if key in first_line:
                    raise SpecError(
                        file=name,
                        field=field,
                        problem=f"duplicate key at {where} (first at {first_line[key]}); "
                        "YAML would silently keep the last value",
                    )
                first_line[key] = where
                stack.append((value_node, field))


def pydantic_error(file: str, exc: ValidationError) -> SpecError:
    err = exc.errors()[0]
    loc, models = _study_path([str(p) for p in err["loc"] if not str(p).startswith(("function-", "union["))])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        keys = list(models[-1].model_fields) if loc and models[-1] is not None else []
        msg = "unknown key" + did_you_mean(loc[-1], keys) if loc else "unknown key"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] == "union_tag_invalid":  # a section's kind that no model of the union has
        loc.append("kind")
        tags = str((err.get("ctx") or {}).get("expected_tags", "")).split(", ")
        msg = "Input should be " + (", ".join(tags[:-1]) + " or " + tags[-1] if len(tags) > 1 else tags[0])
    msg = msg.removeprefix("Value error, ")
    return SpecError(file=file, field=".".join(loc), problem=msg)


def _study_path(loc: list[str]) -> tuple[list[str], list[type[BaseModel] | None]]:
    """The study-file keys of a pydantic error location (the tags pydantic adds for a tagged
    union, such as a launcher section's kind, left out), and the model each key is a field of."""
    model: type[BaseModel] | None = StudySpec
    tagged: dict[str, type[BaseModel]] = {}
    keys: list[str] = []
    models: list[type[BaseModel] | None] = []
    for part in loc:
        if part in tagged:  # the member of the union the section was validated as
            model, tagged = tagged[part], {}
            continue
        keys.append(part)
        models.append(model)
        field = model.model_fields.get(part) if model is not None else None
        model, tagged = _nested(field.annotation if field is not None else None)
    return keys, models


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, dict[str, type[BaseModel]]]:
    """The model a field's annotation holds (the first), and the members of a tagged union by tag."""
    found: list[type[BaseModel]] = []
    tagged: dict[str, type[BaseModel]] = {}
    for t in (annotation, *typing.get_args(annotation)):
        inner, *meta = typing.get_args(t) if typing.get_origin(t) is typing.Annotated else (t,)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            found.append(inner)
            tagged.update({m.tag: inner for m in meta if isinstance(m, Tag)})
    return (found[0] if found else None), tagged


@dataclass(frozen=True)
class LoadedStudy:
    """A validated study: the typed spec, its search space, and resolved locations."""

    spec: StudySpec
    space: Any
    """The resolved :class:`explorer.space.SearchSpace` (typed loosely: spec sits below space and
    never imports it)."""
    file: Path
    """The study file."""
    storage_url: str
    """Resolved SQLAlchemy URL (sqlite paths made absolute)."""
    output_dir: Path
    """The run folder: trial folders and logs, write-ahead files, report, ``best`` files. The
    study file's ``output_dir``, else :func:`explorer.paths.default_output_dir` (one folder per
    storage). ``optimize`` records it in the study's storage and claims it with a marker file
    (:mod:`explorer.study._run_folder`)."""
    model_path: str | None
    """Resolved local model directory or hub id."""
    dataset_path: Path | None
    """Resolved JSONL file, for jsonl datasets."""
    replay_table: Any = None
    """The recorded :class:`explorer.launch.ReplayTable` (read and checked once, by
    :func:`explorer.study_file.load_study`), for ``launcher.kind: replay``."""


def resolve_path(base: Path, p: str) -> Path:
    """``p`` (``~`` expanded) relative to ``base`` unless absolute."""
    path = Path(os.path.expanduser(p))
    return path if path.is_absolute() else (base / path).resolve()


def _default_storage(base: Path, name: str) -> str:
    return f"sqlite:///{(base / f'{name}.db').resolve()}"


def study_spec(
    file: Path,
    *,
    storage: str | None = None,
    n_trials: int | None = None,
    replay_table: str | Path | None = None,
) -> tuple[StudySpec, object]:
    """The typed study file, with the command line's overrides; and the file's own ``storage``
    value (before ``--storage``).

    Raises:
        SpecError: the first problem found, naming the file and the field.
    """
    label = str(file)
    raw = read_yaml(file, label=label)
    if not isinstance(raw, dict):
        raise SpecError(file=label, field="", problem="a study file must be a YAML mapping")
    if n_trials is not None:
        if n_trials < 1:
            raise SpecError(file="--n-trials", field="", problem=f"{n_trials} must be at least 1")
        raw = {**raw, "n_trials": n_trials}
    file_storage = raw.get("storage")  # the study file's own storage, before --storage
    if storage is not None:
        raw = {**raw, "storage": storage}
    if replay_table is not None:  # answer the study from a recorded table (benchmark-search)
        if not table_file(replay_table).is_file():
            raise SpecError(file="--table", field="", problem=f"{replay_table} does not exist")
        launcher = raw.get("launcher")
        keep = (
            {k: v for k, v in launcher.items() if k in ("max_retries", "durations")}
            if isinstance(launcher, dict)
            else {}
        )
        raw = {**raw, "launcher": {**keep, "kind": "replay", "table": str(Path(replay_table).resolve())}}
    try:
        return StudySpec.model_validate(raw), file_storage
    except ValidationError as exc:
        raise pydantic_error(label, exc) from None


def space_source(spec: StudySpec, label: str, base: Path) -> tuple[str, Any]:
    """Where the search space is written (a label for errors) and its raw mapping: a file next
    to the study, or inline."""
    if not isinstance(spec.search_space, str):
        return f"{label} (search_space)", spec.search_space
    space_file = resolve_path(base, spec.search_space)
    space_label = (
        spec.search_space
        if Path(spec.search_space).is_absolute()
        else str(Path(label).parent / spec.search_space)
    )
    if not space_file.is_file():
        raise SpecError(file=label, field="search_space", problem=f"file {space_label} does not exist")
    return space_label, read_yaml(space_file, label=space_label)


def model_path_of(
    spec: StudySpec, label: str, base: Path, *, check_model: bool, probe_hub: bool = False
) -> str | None:
    """The model's local folder or hub id (``None``: built from its architecture, checked here
    when ``check_model``); a hub id must be in the local cache or reachable (``probe_hub``)."""
    model = spec.workload.model
    field = "workload.model.path"
    if model.path is None:
        if check_model:
            _check_architecture(label, model.architecture or {})
        return None
    local = resolve_path(base, model.path)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise SpecError(
                file=label,
                field=field,
                problem=f"{model.path} has no config.json: not a transformers model folder",
            )
        return str(local)
    if local.exists():
        raise SpecError(
            file=label,
            field=field,
            problem=f"{model.path} is a file; give the model's folder (with config.json) or a hub id",
        )
    if model.is_hub_id:
        if probe_hub:
            check_hub_id(model.path, file=label, field=field)
        return model.path
    raise SpecError(file=label, field=field, problem=f"{model.path} does not exist")


HUB_TIMEOUT_S = 10.0
"""How long the hub may take to answer whether a model id exists."""


def check_hub_id(repo: str, *, file: str, field: str) -> None:
    """A hub model id the trials can load: its ``config.json`` is in the local Hugging Face cache,
    or the hub (``HF_ENDPOINT``) answers that it exists. Nothing is downloaded.

    Raises:
        SpecError: offline (``HF_HUB_OFFLINE``) with no cached copy, the hub unreachable, or no
            such model (or a gated or private one without a token).
    """
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo, "config.json"), str):
        return
    fix = f"download it first (hf download {repo} config.json) or give a local folder"
    if constants.HF_HUB_OFFLINE:
        problem = f"hub id {repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; {fix}"
        raise SpecError(file=file, field=field, problem=problem)
    try:
        get_hf_file_metadata(hf_hub_url(repo, "config.json"), timeout=HUB_TIMEOUT_S)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        why = "is gated or private (set HF_TOKEN)" if isinstance(exc, GatedRepoError) else "does not exist"
        raise SpecError(
            file=file, field=field, problem=f"hub id {repo} {why} on {constants.ENDPOINT}"
        ) from None
    except Exception as exc:  # httpx's connect and timeout errors, HTTP errors: the hub is out of reach
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        problem = f"cannot reach {constants.ENDPOINT} for hub id {repo} ({first}), and it is not in the local cache; {fix}"
        raise SpecError(file=file, field=field, problem=problem) from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Files of which a model folder holds at least one when ``AutoTokenizer`` can load a tokenizer
from it (fast, sentencepiece, BPE or WordPiece; a remote-code tokenizer has its config)."""


def dataset_path_of(spec: StudySpec, label: str, base: Path, *, model_path: str | None) -> Path | None:
    """The JSONL file of a ``jsonl`` dataset (``None`` for synthetic data); a local model folder
    (``model_path``) must hold the tokenizer that reads it (a hub id is not looked up)."""
    if spec.workload.dataset.kind != "jsonl":
        return None
    path = resolve_path(base, spec.workload.dataset.path or "")
    if not path.is_file():
        raise SpecError(
            file=label,
            field="workload.dataset.path",
            problem=f"{spec.workload.dataset.path} "
            + ("is a folder; give a JSONL file" if path.is_dir() else "does not exist"),
        )
    _check_first_record(spec, label, path)
    folder = Path(model_path) if model_path else None
    if folder is not None and folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise SpecError(
            file=label,
            field="workload.model.path",
            problem=f"{spec.workload.model.path} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...), "
            "which the jsonl dataset needs",
        )
    return path


def _check_first_record(spec: StudySpec, label: str, path: Path) -> None:
    """The JSONL file's first entry is a JSON object with the text field (the rest is read by the
    trial)."""
    field, text_field = "workload.dataset.text_field", spec.workload.dataset.text_field
    with path.open(encoding="utf-8", errors="replace") as fh:
        first = next((line for line in fh if line.strip()), None)
    if first is None:
        raise SpecError(file=label, field="workload.dataset.path", problem=f"{path.name} has no entries")
    try:
        record = json.loads(first)
    except json.JSONDecodeError as exc:
        problem = f"the first entry of {path.name} is not JSON: {exc}"
        raise SpecError(file=label, field="workload.dataset.path", problem=problem) from None
    chat = (
        spec.workload.trainer == "trl"
        and isinstance(record, dict)
        and isinstance(record.get("messages"), list)
    )
    if not chat and (not isinstance(record, dict) or not isinstance(record.get(text_field), str)):
        keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
        problem = f"the first entry of {path.name} has no text field {text_field!r} (it has: {keys})"
        raise SpecError(file=label, field=field, problem=problem)


def storage_and_run_folder(
    spec: StudySpec, label: str, base: Path, *, file_storage: object, from_cli: bool
) -> tuple[str, Path]:
    """The resolved storage URL and the run folder (the study file's ``output_dir``, else one
    folder per storage, :func:`explorer.paths.default_output_dir`)."""
    storage_url = _check_storage_url(label, spec.storage, base, spec.name, from_cli)
    if spec.output_dir:
        folder = resolve_path(base, spec.output_dir)
        check_run_folder(folder, file=label)
        return storage_url, folder
    own = _file_storage(label, file_storage, base, spec.name)
    folder = default_output_dir(base, spec.name, storage_url, own)
    check_run_folder(folder, file=label)
    return storage_url, folder


ARCH = "workload.model.architecture"
SIZE_KEY = re.compile(r"^(num_|n_)|_size$|_dim$|_heads$|_layers$|^max_position_embeddings$")
"""Architecture keys that are sizes or counts: positive, unless the config class's own default is
zero or negative (a sentinel such as ``num_shared_experts: 0``)."""
ACTIVATION_KEY = re.compile(r"_act$|activation$|activation_function$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _attr(config: Any, key: str) -> Any:
    """``config.key``, or None where the config has none or will not say (a heterogeneous
    config raises its own error for a per-layer attribute read globally)."""
    try:
        return getattr(config, key, None)
    except Exception:  # AmbiguousGlobalPerLayerAttributeError and the like: no single value
        return None


@contextlib.contextmanager
def _transformers_warnings() -> Iterator[list[str]]:
    """Collect what transformers logs at WARNING and above instead of printing it (the CLI prints
    one line), and silence Python warnings (deprecations) meanwhile.

    transformers logs some of its config checks with ``logger.warning_once`` (cached for the
    process): meanwhile it logs every time, so that a second study loaded in the same process
    (a test, a benchmark) is checked as the first was.
    """
    import warnings

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    def _every_time(self: logging.Logger, *args: Any, **kwargs: Any) -> None:
        self.warning(*args, **kwargs)

    messages: list[str] = []
    logger = logging.getLogger("transformers")
    handlers, level = logger.handlers[:], logger.level
    once = getattr(logging.Logger, "warning_once", None)
    logger.handlers, logger.level = [_Collect(logging.WARNING)], logging.WARNING
    if once is not None:
        logging.Logger.warning_once = _every_time  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield messages
    finally:
        logger.handlers, logger.level = handlers, level
        if once is not None:
            logging.Logger.warning_once = once  # type: ignore[attr-defined]


def _config_keys(config_cls: Any, default: Any) -> set[str]:
    """The keys a transformers config class knows: its ``__init__`` parameters (in transformers
    5 a dataclass, so PretrainedConfig's common keys too), its fields, its ``attribute_map``
    aliases, and the attributes a default instance holds."""
    params = inspect.signature(config_cls.__init__).parameters.values()
    keys = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    if dataclasses.is_dataclass(config_cls):
        keys |= {f.name for f in dataclasses.fields(config_cls)}
    keys |= set(getattr(config_cls, "attribute_map", {}) or {})
    if default is not None:
        keys |= set(vars(default))
    return keys


def _check_architecture(label: str, arch: dict[str, Any]) -> None:
    """Build the architecture's transformers config, as the worker will, and refuse what would
    only fail inside a trial (or silently build another model): a key the config class does not
    know (it would be stored and ignored), a size or count that is not positive, a non-finite
    number, an unknown activation, what the config itself rejects or warns about (beyond what its
    defaults warn about), and key-value heads that do not divide the attention heads."""
    from transformers import CONFIG_MAPPING
    from transformers.activations import ACT2FN

    model_type = arch.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise SpecError(
            file=label,
            field=f"{ARCH}.model_type",
            problem=f"{model_type!r} is not a transformers model type (for example llama, granite, mistral)",
        )
    config_cls = CONFIG_MAPPING[model_type]
    given = {k: v for k, v in arch.items() if k != "model_type"}
    with _transformers_warnings() as warned_by_default:
        try:
            default = config_cls()
        except Exception:  # a config with required parts: no defaults to compare with
            default = None
    for key, value in given.items():
        field = f"{ARCH}.{key}"
        known_value = _attr(default, key)
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(file=label, field=field, problem=f"{value} is not a finite number")
        sentinel = _is_int(known_value) and known_value <= 0  # the class's own default is <= 0
        if SIZE_KEY.search(key) and _is_int(value) and value <= 0 and not sentinel:
            raise SpecError(file=label, field=field, problem=f"{value} must be positive (a size or a count)")
        activation = isinstance(known_value, str) and known_value in ACT2FN
        if ACTIVATION_KEY.search(key) and activation and isinstance(value, str) and value not in ACT2FN:
            problem = f"{value!r} is not a transformers activation{did_you_mean(value, ACT2FN)}"
            raise SpecError(file=label, field=field, problem=problem)
    with _transformers_warnings() as warned:
        try:
            config = config_cls(**copy.deepcopy(given))  # it fills in nested dicts (rope_scaling)
        except Exception as exc:  # TypeError, ValueError, or huggingface_hub's StrictDataclassError
            named = re.match(r"Validation error for field '([^']+)'", str(exc))
            field = f"{ARCH}.{named.group(1)}" if named else ARCH
            raise SpecError(file=label, field=field, problem=str(exc.__cause__ or exc)) from None
    known = _config_keys(config_cls, default)
    unknown = [k for k in given if k not in known and k in vars(config)]  # stored, never read
    if unknown:
        key = unknown[0]
        raise SpecError(
            file=label,
            field=f"{ARCH}.{key}",
            problem=f"unknown key for model_type {model_type!r} ({config_cls.__name__}){did_you_mean(key, known)}",
        )
    warned = [w for w in warned if w not in warned_by_default]  # the class's own defaults warn
    if warned:
        raise SpecError(file=label, field=ARCH, problem=f"transformers: {warned[0]}")
    heads, kv_heads = _attr(config, "num_attention_heads"), _attr(config, "num_key_value_heads")
    if _is_int(heads) and _is_int(kv_heads) and heads > 0 and kv_heads > 0 and heads % kv_heads:
        raise SpecError(
            file=label,
            field=f"{ARCH}.num_key_value_heads",
            problem=f"{kv_heads} does not divide num_attention_heads ({heads})",
        )


def _file_storage(label: str, url: object, base: Path, name: str) -> str:
    """The study file's own storage URL, resolved (its default when it names none); a bad one is
    an error even under ``--storage``."""
    if not isinstance(url, str):
        return _default_storage(base, name)
    return _check_storage_url(label, url, base, name, False)


def _check_storage_url(label: str, url: str | None, base: Path, name: str, from_cli: bool) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    file, field = ("--storage", "") if from_cli else (label, "storage")
    if url is None:
        return _default_storage(base, name)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        shown = mask_url(url)  # never print a password, wherever it sits
        raise SpecError(file=file, field=field, problem=f"{shown!r} is not an SQLAlchemy URL") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql", "mysql"):
        raise SpecError(
            file=file, field=field, problem=f"unsupported scheme {backend!r}; use sqlite, postgresql or mysql"
        )
    if backend == "sqlite":
        db = parsed.database
        if not db or db == ":memory:":
            raise SpecError(file=file, field=field, problem="sqlite needs a file path (in-memory is lost)")
        db_path = Path(db) if Path(db).is_absolute() else (base / db).resolve()
        if not db_path.parent.is_dir():
            raise SpecError(
                file=file,
                field=field,
                problem=f"cannot reach storage: folder {db_path.parent} does not exist",
            )
        if db_path.is_dir():
            raise SpecError(file=file, field=field, problem=f"{db_path} is a folder, not an sqlite file")
        return f"sqlite:///{db_path}"
    _check_driver(parsed, file=file, field=field)
    return url


def _check_driver(parsed: Any, *, file: str, field: str) -> None:
    """The URL's database driver imports (``mysql://`` needs ``mysqlclient``, ``postgresql://``
    ``psycopg2``): SQLAlchemy loads the dialect and its DBAPI module, as opening the storage would."""
    from sqlalchemy.exc import NoSuchModuleError

    try:
        parsed.get_dialect().import_dbapi()
    except (ImportError, NoSuchModuleError) as exc:
        why = f"no module {exc.name!r}" if isinstance(exc, ImportError) and exc.name else str(exc)
        raise SpecError(
            file=file,
            field=field,
            problem=f"the database driver of {parsed.drivername}:// cannot be loaded ({why}): install "
            "it, or name an installed one in the URL (dialect+driver://)",
        ) from None
