"""Shared fixtures: a real tiny study on the CPU (2 logical GPUs, gloo), and real storage: sqlite
files and a real PostgreSQL server (``tests/_postgres.py``)."""

from __future__ import annotations

import copy
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

TINY_ARCH = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 256,
}

BASE_STUDY: dict[str, Any] = {
    "name": "test",
    "sampler": {"kind": "tpe", "seed": 0},
    "n_trials": 4,
    "workload": {
        "model": {"name": "tiny-llama", "architecture": TINY_ARCH},
        "dataset": {"kind": "synthetic", "entries": 512, "min_tokens": 16, "max_tokens": 96, "seed": 1},
        "model_max_length": 64,
    },
    "measurement": {"warmup_steps": 1, "measured_steps": 3, "trial_timeout_s": 240},
    "resources": {"gpus_per_node": 2, "gpu_model": "CPU-logical", "device": "cpu", "device_memory_gib": 0.5},
    "search_space": {
        "parameters": {
            "batch_size": {"values": [4, 8]},
            "number_gpus": {"values": [1, 2]},
            "distributed_backend": {"choices": ["DDP", "FSDP"]},
            "fsdp_version": {"choices": [1, 2]},
            "fsdp_sharding_strategy": {"choices": ["FULL_SHARD", "SHARD_GRAD_OP"]},
            "gradient_checkpointing": {"choices": [False, True]},
        }
    },
}


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``patch`` into a copy of ``base`` (a value of ``None`` deletes the key)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def write_study(tmp_path: Path):
    """Write a study file (``BASE_STUDY`` patched) into tmp_path; returns its path."""

    def _write(patch: dict[str, Any] | None = None, name: str = "study.yaml") -> Path:
        """A search_space in ``patch`` replaces the base one instead of merging into it."""
        patch = patch or {}
        base = merge(BASE_STUDY, {"search_space": None}) if "search_space" in patch else BASE_STUDY
        data = merge(base, patch)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return _write


@pytest.fixture
def ray_local():
    """A local Ray with 2 logical GPUs, shut down after the test."""
    import ray

    ray.init(
        num_gpus=2,
        resources={"CPU-logical": 2},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def make_job(write_study):
    """Build a TrialJob for ``config`` fields on the tiny workload (optionally patching the study)."""
    from explorer.job import TrialJob
    from explorer.study_file import load_study
    from explorer.trial_config import TrialConfig

    def _make(study_patch: dict[str, Any] | None = None, **config: Any) -> TrialJob:
        loaded = load_study(write_study(study_patch or {}))
        fields = {"gradient_checkpointing": False, "model_max_length": loaded.spec.workload.model_max_length}
        fields.update(config)
        if loaded.spec.workload.method.kind == "lora":
            fields.setdefault("lora_r", loaded.spec.workload.method.r)
        return TrialJob.for_study(loaded, TrialConfig(**fields), trial_number=0)

    return _make


STORAGES = ("sqlite", "postgresql")
"""The storage backends every test of the shared suite runs against (``storage_url``)."""


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL server on 127.0.0.1 at a free port, for the whole session.

    Started at the first test that needs it and stopped (its process gone, its folder removed)
    at the end of the session. Missing binaries or a server that does not start FAIL the tests
    that need it, with the reason: ``make test`` installs the binaries (``scripts/postgres.sh``).
    """
    from tests._postgres import PostgresServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        pytest.fail(
            "PostgreSQL server binaries (initdb, pg_ctl) not found; run: scripts/postgres.sh install",
            pytrace=False,
        )
    server = PostgresServer(bindir)
    try:
        server.start()
    except RuntimeError as exc:
        server.stop()
        pytest.fail(f"could not start PostgreSQL from {bindir}: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> Iterator[str]:
    """The URL (with user and password) of a fresh, empty database of its own for this test,
    dropped afterwards."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


@pytest.fixture(params=STORAGES)
def storage_url(request, tmp_path: Path) -> str:
    """A fresh, empty storage for the test, once per backend (the way Optuna's tests
    parametrize over storages): ``sqlite:///<tmp_path>/s.db``, then a new database on the
    session's PostgreSQL server (``postgresql+psycopg://explorer:PASSWORD@127.0.0.1:PORT/DB``).

    To run a test against every backend, take this fixture and put the URL into the study
    (``write_study({"storage": storage_url, ...})``) or pass it as ``--storage``::

        def test_something(write_study, storage_url):
            loaded = load_study(write_study({"storage": storage_url}))

    The test id ends in ``[sqlite]`` or ``[postgresql]``; ``-k postgresql`` picks one backend.
    A test that needs PostgreSQL only takes ``postgres_url`` (or ``postgres_server`` for the
    server itself: ``url(db, password=False)``, ``create_database()``).
    """
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/s.db"
    return str(request.getfixturevalue("postgres_url"))


SLOW_FOR_TIME = frozenset(
    {
        # The longest tests of the default suite (``--durations`` on a shared 2-core machine, in
        # benchmarks/results/suite_durations.txt), moved to ``make test-slow`` so that ``make test``
        # stays under 10 minutes; each path keeps a shorter test in the default suite (named after #).
        "test_signals.py::test_sigterm_to_the_process_group_marks_the_trial_interrupted_and_the_resume_finishes",  # 63 s; once_stopping
        "test_signals.py::test_ctrl_c_to_the_process_group_exits_130_with_one_line",  # 15 s; once_stopping, while_ray_starts
        "test_storage_race.py::test_processes_opening_a_fresh_file_at_once_all_succeed",  # 14 s; test_read_only_study, test_concurrency
        "test_search_benchmark.py::test_the_command_replays_each_variant",  # 9 s; the rest of test_search_benchmark
        "test_ray_address.py::test_a_server_that_accepts_but_never_answers_is_one_line_within_seconds",  # 8 s; the probe tests
        "test_warm_start.py::test_the_zygote_exits_with_its_owner",  # 7 s; a_second_owner_gets_a_zygote
        "test_search_sequences.py::test_benchmark_search_walks_the_recorded_trials[granite-3.1-2b-wide]",  # 9 s; the other tables
        "test_measurement.py::test_dataset_tokens_recount_in_every_padding_mode[longest-1-NONE]",  # 8 s; [packed-1-NONE]
        "test_trl_trainer.py::test_a_trl_trial_counts_the_entries_it_consumed[max_length]",  # 12 s; the_sft_config_best_writes_loads_in_sft_config_and_trains
        "test_local_model.py::test_local_checkpoint_and_jsonl_dataset[pretrained]",  # 11 s; test_local_data
        "test_storages.py::test_failed_trial_is_retried_then_failed[sqlite]",  # 10 s; test_faults' a_fault_on_every_attempt
        "test_backends.py::test_backend_really_runs[warm-FSDP-1-NO_SHARD]",  # 8 s; the other warm FSDP1 variant
        "test_backends.py::test_backend_really_runs[warm-FSDP-1-FULL_SHARD]",  # 8 s
        "test_run_knobs.py::test_a_study_searches_the_new_knobs",  # 58 s; test_knobs, test_apply
        "test_cli_measure.py::test_measure_exits_1_when_no_repeat_measured",  # 51 s; refuses_an_invalid
        "test_backends.py::test_lora_through_peft[FSDP2]",  # 46 s
        "test_backends.py::test_lora_through_peft[DDP]",  # 32 s; test_local_model runs LoRA
        "test_faults.py::test_sigkill_and_sigint_of_the_driver_then_resume_lose_nothing[sqlite]",  # 46 s; runs_out_of_configurations
        "test_storages.py::test_optimize_records_ok_oom_invalid_and_resumes_without_starting_over[sqlite]",  # 45 s; failed_trial_is_retried
        "test_faults_real.py::test_a_real_oom_segfault_and_node_restart[sqlite]",  # 42 s; test_backends crash, forced_oom
        "test_secrets.py::test_postgresql_password_in_the_query_string_or_with_an_at_is_never_printed",  # 36 s; the rest of test_secrets
        "test_backends.py::test_backend_really_runs[cold-FSDP-1-FULL_SHARD]",  # 36 s; warm variants
        "test_backends.py::test_backend_really_runs[cold-FSDP-2-FULL_SHARD-ckpt]",  # 33 s
        "test_backends.py::test_backend_really_runs[cold-FSDP-2-SHARD_GRAD_OP]",  # 31 s
        "test_backends.py::test_backend_really_runs[cold-FSDP-1-NO_SHARD]",  # 29 s
        "test_backends.py::test_backend_really_runs[cold-DDP]",  # 28 s
        "test_backends.py::test_backend_really_runs[cold-FSDP-1-SHARD_GRAD_OP-ckpt]",  # 26 s
        "test_backends.py::test_accelerate_launch_runner",  # 28 s
        "test_passthrough.py::test_a_study_passes_training_arguments_to_its_trials",  # 35 s; the passthrough unit tests
        "test_storages.py::test_two_optimize_processes_share_one_study[postgresql]",  # 62 s
        "test_storages.py::test_two_optimize_processes_share_one_study[sqlite]",  # 48 s; test_storage_race
        "test_ray_address.py::test_validate_offline_checks_a_cluster_study_without_its_cluster",  # 18 s; the probe tests
        "test_security.py::test_secrets_of_the_driver_do_not_reach_a_real_trials_processes",  # 20 s; the rest of test_security
        "test_faults.py::test_a_study_that_runs_out_of_configurations_says_so_and_audits",  # 17 s; each_fault_ends_as_defined
        "test_benchmark_results.py::test_knobs_table_parses_covers_its_study_and_recomputes",  # 15 s; the other tables
        "test_secrets.py::test_a_storage_lost_mid_run_is_one_line_without_the_password_and_keeps_its_trials",  # 47 s; crash_prints
        "test_measurement.py::test_dataset_tokens_recount[2-DDP-2-True]",  # 28 s; the 1-process recounts
        "test_measurement.py::test_dataset_tokens_recount[2-DDP-1-False]",  # 27 s
        "test_measurement.py::test_dataset_tokens_recount_in_every_padding_mode[packed-2-DDP]",  # 27 s
        "test_secrets.py::test_dashboards_started_at_the_printed_line_serve_the_study_and_printed_commands_run",  # 28 s; test_dashboard
        "test_storages.py::test_two_storages_of_one_study_file_keep_their_own_run_folders",  # 25 s; an_output_dir_of_another_storage (in process)
        "test_local_model.py::test_local_checkpoint_and_jsonl_dataset[random]",  # 20 s; [pretrained]
        "test_backends.py::test_forced_oom_is_classified_and_fails_fast[cold]",  # 28 s; [warm]
        "test_backends.py::test_crash_is_failed_not_oom[cold]",  # 15 s; [warm]
        "test_backends.py::test_backend_really_runs[cold-NONE-ckpt]",  # 18 s; [warm-NONE-ckpt]
        "test_measurement.py::test_dataset_tokens_recount[1-NONE-2-False]",  # 27 s; every_padding_mode
        "test_local_data.py::test_packed_trial_counts_the_dataset_tokens",  # 20 s; every_padding_mode[packed]
        "test_objectives.py::test_a_two_objective_quickstart_has_a_pareto_front",  # 26 s; the rest of test_objectives
    }
)
"""Default-suite tests run only with the slow ones (``make test-slow``; CI runs both)."""


def pytest_configure(config: pytest.Config) -> None:
    """Start from the SIGINT a terminal gives a foreground run.

    A suite started in the background by a non-interactive shell (``make test &`` in a script)
    inherits SIGINT ignored. Python then installs no KeyboardInterrupt handler, in pytest and in
    every explorer process the signal tests start and interrupt (an ignored signal stays ignored
    across exec, which explorer honours on purpose: ``tests/test_signals.py``)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow_postgresql``: the PostgreSQL case of a storage-suite test is ``slow``
    (its sqlite case keeps the path in the default suite; the slow run covers both backends).
    The tests of :data:`SLOW_FOR_TIME` are ``slow`` too."""
    for item in items:
        if item.nodeid.split("/")[-1] in SLOW_FOR_TIME:
            item.add_marker(pytest.mark.slow)
        callspec = getattr(item, "callspec", None)
        if (
            item.get_closest_marker("slow_postgresql")
            and callspec is not None
            and callspec.params.get("storage_url") == "postgresql"
        ):
            item.add_marker(pytest.mark.slow)
