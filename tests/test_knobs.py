"""The knob registry: a knob declared once, here in the test only, flows through the search space,
its validation, OOM inference (by its memory direction), the replay table, ``measure --set`` and
the run's ``TrainingArguments``; adding it leaves earlier configuration keys valid."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from explorer.errors import SpecError
from explorer.knobs import Axis, Knob, Rule, knob, knobs, positive, register
from explorer.launch import ReplayTable
from explorer.measure import config_from_cli
from explorer.search import inferred_oom, memory_dominates, throughput_dominates
from explorer.study._lines import describe
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig

EMPTY_CACHE = Knob(
    name="torch_empty_cache_steps",
    kind="int",
    check=positive,
    doc="empty the CUDA cache every N steps",
    memory=Axis("increasing"),  # emptying it less often holds more memory
    training_args="torch_empty_cache_steps",
)
"""A knob that exists only in this test: a TrainingArguments keyword with a memory direction."""

BASE = dict(
    batch_size=8,
    number_gpus=1,
    distributed_backend="NONE",
    gradient_checkpointing=False,
    model_max_length=64,
)


@pytest.fixture
def empty_cache():
    with register(EMPTY_CACHE):
        yield EMPTY_CACHE
    assert "torch_empty_cache_steps" not in {k.name for k in knobs()}


def _space(values: list[int] | int) -> dict:
    domain = {"values": values} if isinstance(values, list) else values
    return {
        "search_space": {
            "parameters": {
                "batch_size": {"values": [4, 8]},
                "number_gpus": 1,
                "gradient_checkpointing": False,
                "torch_empty_cache_steps": domain,
            }
        }
    }


def test_the_space_searches_it_and_validates_it(write_study, empty_cache):
    loaded = load_study(write_study(_space([1, 4])), check_model=False)
    configs = list(loaded.space.enumerate())
    assert {c.torch_empty_cache_steps for c in configs} == {1, 4}
    assert len(configs) == 4
    assert "torch_empty_cache_steps=4" in describe(TrialConfig(**BASE, torch_empty_cache_steps=4))
    with pytest.raises(SpecError, match=r"parameters\.torch_empty_cache_steps: 0 must be a positive integer"):
        load_study(write_study(_space([0, 4])), check_model=False)
    with pytest.raises(SpecError, match="did you mean torch_empty_cache_steps"):
        load_study(
            write_study(
                {
                    "search_space": {
                        "parameters": {**_space(1)["search_space"]["parameters"], "torch_empty_cache_step": 2}
                    }
                }
            ),
            check_model=False,
        )


def test_a_space_without_it_leaves_it_unset(write_study, empty_cache):
    loaded = load_study(write_study(), check_model=False)
    assert "torch_empty_cache_steps" not in loaded.space.domains
    assert all(c.torch_empty_cache_steps is None for c in loaded.space.enumerate())


def test_inference_and_the_prior_follow_its_declared_direction(empty_cache):
    often = TrialConfig(**BASE, torch_empty_cache_steps=1)
    rarely = TrialConfig(**BASE, torch_empty_cache_steps=8)
    assert memory_dominates(rarely, often) and not memory_dominates(often, rarely)
    assert inferred_oom(rarely, [(3, often)]) == 3 and inferred_oom(often, [(3, rarely)]) is None
    # no speed role declared: compared only at the same value
    assert not throughput_dominates(rarely, often) and not throughput_dominates(often, rarely)
    assert throughput_dominates(rarely, rarely)


def test_replay_matches_its_column_and_reads_an_old_table_as_unset(tmp_path, empty_cache):
    path = tmp_path / "table.csv"
    rows = [(1, 100.0, 1), (4, 130.0, 1), (8, 0.0, 0)]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*BASE, "torch_empty_cache_steps", "dataset_tokens_per_second_per_gpu", "is_valid"])
        for steps, value, valid in rows:
            w.writerow([*BASE.values(), steps, value, valid])
    table = ReplayTable.read(path)
    assert "torch_empty_cache_steps" in table.parameters
    answer = table.measurement(TrialConfig(**BASE, torch_empty_cache_steps=4))
    assert answer.properties is not None and answer.properties.dataset_tokens_per_second_per_gpu == 130.0
    assert table.measurement(TrialConfig(**BASE, torch_empty_cache_steps=8)).outcome.value == "oom"
    assert table.missing_columns([TrialConfig(**BASE, torch_empty_cache_steps=s) for s in (1, 4)]) == []
    old = tmp_path / "old.csv"
    old.write_text(
        ",".join([*BASE, "dataset_tokens_per_second_per_gpu"])
        + "\n"
        + ",".join([*(str(v) for v in BASE.values()), "90.0"])
        + "\n"
    )
    old_table = ReplayTable.read(old)
    assert old_table.measurement(TrialConfig(**BASE)).outcome.value == "ok"
    assert old_table.missing_columns([TrialConfig(**BASE, torch_empty_cache_steps=s) for s in (1, 4)]) == [
        "torch_empty_cache_steps"
    ]


def test_measure_set_takes_it_and_the_space_constants(write_study, empty_cache):
    loaded = load_study(write_study(_space([1, 4])), check_model=False)
    # number_gpus and gradient_checkpointing are constants of the space: not demanded again
    config = config_from_cli(loaded, sets=["batch_size=8", "torch_empty_cache_steps=4"], config_file=None)
    assert config.torch_empty_cache_steps == 4 and config.number_gpus == 1
    assert config.model_max_length == loaded.spec.workload.model_max_length
    with pytest.raises(SpecError, match="torch_empty_cache_steps: 'x' is not an integer"):
        config_from_cli(loaded, sets=["batch_size=8", "torch_empty_cache_steps=x"], config_file=None)
    with pytest.raises(
        SpecError, match="torch_empty_cache_step: unknown parameter; did you mean torch_empty_cache_steps"
    ):
        config_from_cli(loaded, sets=["batch_size=8", "torch_empty_cache_step=4"], config_file=None)
    with pytest.raises(SpecError, match="torch_empty_cache_steps: give one value"):
        config_from_cli(
            loaded, sets=["batch_size=8", "torch_empty_cache_steps={values: [1, 4]}"], config_file=None
        )
    with pytest.raises(SpecError, match="--set: batch_size: required"):
        config_from_cli(loaded, sets=[], config_file=None)


def test_it_reaches_the_training_arguments(make_job, tmp_path, empty_cache):
    from transformers import TrainingArguments

    from explorer.worker._train import training_kwargs

    job = make_job(distributed_backend="NONE", batch_size=4, number_gpus=1, torch_empty_cache_steps=4)
    kwargs = training_kwargs(job, device_type="cpu", layer_classes=None)
    assert kwargs["torch_empty_cache_steps"] == 4
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, **kwargs)
    assert args.torch_empty_cache_steps == 4
    unset = training_kwargs(
        make_job(distributed_backend="NONE", batch_size=4, number_gpus=1),
        device_type="cpu",
        layer_classes=None,
    )
    assert "torch_empty_cache_steps" not in unset


def test_adding_a_knob_at_its_default_keeps_every_key():
    before = TrialConfig(**BASE).key()
    flag = Knob(
        name="use_liger_kernel",
        kind="bool",
        default=False,
        doc="Liger kernels",
        training_args="use_liger_kernel",
    )
    with register(EMPTY_CACHE, flag):
        at_default = TrialConfig(**BASE)
        assert at_default.key() == before
        assert TrialConfig.from_dict(TrialConfig(**BASE).to_dict() | {"use_liger_kernel": True}).key() == (
            before + "-use_liger_kernel.True"
        )
        assert TrialConfig(**BASE, torch_empty_cache_steps=2).key() == before + "-torch_empty_cache_steps.2"
        # a trial stored before the knobs existed reads back as their defaults
        old = TrialConfig.from_dict({k: v for k, v in TrialConfig(**BASE).to_dict().items() if k in BASE})
        assert old.use_liger_kernel is False and old.torch_empty_cache_steps is None and old.key() == before


def test_the_first_keys_are_unchanged():
    """The configuration key of the knobs that predate the registry, in their order, every one of
    them, ``None`` left out (stored measurements and committed tables use these keys)."""
    c = TrialConfig(
        **{**BASE, "number_gpus": 2, "batch_size": 8, "distributed_backend": "FSDP"},
        fsdp_version=2,
        fsdp_sharding_strategy="FULL_SHARD",
    )
    assert c.key() == (
        "batch_size.8-number_gpus.2-distributed_backend.FSDP-gradient_checkpointing.False-model_max_length.64"
        "-fsdp_sharding_strategy.FULL_SHARD-fsdp_version.2-gradient_accumulation_steps.1-optim.adamw_torch"
        "-torch_compile.False-number_nodes.1"
    )


def test_registration_is_checked():
    with pytest.raises(ValueError, match="declared already"), register(knob("batch_size")):
        pass
    with pytest.raises(ValueError, match="not an identifier"):
        Knob(name="two words", kind="int", doc="")
    with pytest.raises(ValueError, match="default 0"):
        Knob(name="steps", kind="int", default=0, check=positive, doc="")


def test_the_reference_page_is_up_to_date():
    """``docs/knobs.md`` is what ``python -m explorer.knobs`` prints, and names every knob."""
    from explorer.knobs import reference

    page = (Path(__file__).resolve().parents[1] / "docs" / "knobs.md").read_text()
    assert page == reference(), "regenerate: .venv/bin/python -m explorer.knobs > docs/knobs.md"
    assert all(f"| `{k.name}` |" in page for k in knobs())


def test_ddp_trials_skip_the_search_for_unused_parameters(make_job):
    from explorer.worker._train import training_kwargs

    ddp = training_kwargs(
        make_job(distributed_backend="DDP", batch_size=4, number_gpus=2),
        device_type="cpu",
        layer_classes=None,
    )
    single = training_kwargs(
        make_job(distributed_backend="NONE", batch_size=4, number_gpus=1),
        device_type="cpu",
        layer_classes=None,
    )
    assert ddp["ddp_find_unused_parameters"] is False and "ddp_find_unused_parameters" not in single


def test_under_compile_flash_attention_and_liger_have_no_speed_order():
    """torch_compile: flash attention's unpadding and Liger's functions break the graph, so the
    throughput prior puts neither above its alternative there (issue 23); without compile it does."""
    base = TrialConfig(**BASE)
    for compiled in (False, True):
        c = base.replace(torch_compile=compiled)
        flash, sdpa = (
            c.replace(attn_implementation="flash_attention_2"),
            c.replace(attn_implementation="sdpa"),
        )
        liger, plain = c.replace(liger_kernel=True), c.replace(liger_kernel=False)
        assert knob("attn_implementation").speed_at_least(flash, sdpa) is not compiled
        assert knob("liger_kernel").speed_at_least(liger, plain) is not compiled
        assert not knob("attn_implementation").speed_at_least(sdpa, flash)
        assert not knob("liger_kernel").speed_at_least(plain, liger)


def test_a_rule_reads_no_field_but_the_ones_it_names():
    """A :class:`Rule` (a memory or speed order that depends on other knobs) is tabulated over
    the fields it names (the frontier walk's dominance): with every other field of both
    configurations replaced by another configuration's, its answer stays the same."""
    import random

    from explorer.search._neighbours import LocalSearch

    loaded = load_study(
        Path(__file__).resolve().parents[1]
        / "benchmarks/search_studies/knobs/granite-2b-a100-80x4-compile.yaml",
        check_model=False,
    )
    valid = LocalSearch(space=loaded.space, resources=loaded.spec.resources).valid()
    rng = random.Random(0)
    rules = [(k.name, order) for k in knobs() for order in (k.memory, k.speed) if isinstance(order, Rule)]
    assert len(rules) >= 8
    for name, rule in rules:
        answers = set()
        for _ in range(400):
            a, b, other_a, other_b = rng.sample(valid, 4)
            moved_a = other_a.replace(**dict(zip(rule.reads, rule.view(a), strict=True)))
            moved_b = other_b.replace(**dict(zip(rule.reads, rule.view(b), strict=True)))
            assert rule(moved_a, moved_b) == rule(a, b), (name, rule.reads, a, b)
            answers.add(rule(a, b))
        assert answers == {True, False}, name  # the pairs reach both answers
