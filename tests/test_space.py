"""Search-space domains, the conditional structure, and the is_valid rules (no training)."""

from __future__ import annotations

import optuna
import pytest
from pydantic import ValidationError

from explorer.errors import SpecError
from explorer.space import Categorical, Fixed, Ordered, SearchSpace, parse_domain
from explorer.spec import ResourcesSpec, WorkloadSpec
from explorer.study import describe
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

from .conftest import BASE_STUDY

WORKLOAD = WorkloadSpec.model_validate(BASE_STUDY["workload"])


def _space(params: dict) -> SearchSpace:
    return SearchSpace.from_raw({"parameters": params}, file="s.yaml", workload=WORKLOAD)


def test_ordered_domains_are_integers_not_categories():
    pow2 = parse_domain({"values": [16, 1, 4, 2, 8]}, kind="int")
    assert isinstance(pow2, Ordered) and pow2.values == (1, 2, 4, 8, 16)
    assert pow2.param_name("batch_size") == "log2_batch_size"
    assert parse_domain({"low": 1, "high": 4}, kind="int").param_name("number_gpus") == "number_gpus"
    odd = parse_domain({"values": [1, 3, 10]}, kind="int")
    assert odd.param_name("batch_size") == "batch_size_index"
    assert parse_domain({"low": 3, "high": 70, "log2": True}, kind="int").values == (4, 8, 16, 32, 64)
    assert isinstance(parse_domain({"choices": ["DDP", "FSDP"]}, kind="str"), Categorical)
    assert parse_domain(7, kind="int") == Fixed(7)


@pytest.mark.parametrize(
    ("raw", "kind", "message"),
    [
        ({"values": []}, "int", "empty"),
        ({"choices": []}, "str", "empty"),
        ({"low": 8, "high": 2}, "int", "empty"),
        ({"values": [1, 1]}, "int", "duplicates"),
        ({"values": [1, "a"]}, "int", "not an integer"),
        ([1, 2], "int", "needs a key"),
        ({"low": 1, "high": 4, "typo": 1}, "int", "unknown domain keys"),
    ],
)
def test_bad_domains(raw, kind, message):
    with pytest.raises(ValueError, match=message):
        parse_domain(raw, kind=kind)


def test_encoding_round_trips_through_optuna():
    space = _space(BASE_STUDY["search_space"]["parameters"] | {"batch_size": {"values": [2, 4, 8, 16]}})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(30):
        trial = study.ask()
        config = space.suggest(trial)
        assert space.params_for(config) == trial.params
        study.tell(trial, 1.0)


def test_conditional_parameters_only_when_active():
    space = _space(BASE_STUDY["search_space"]["parameters"])
    configs = list(space.enumerate())
    singles = [c for c in configs if c.number_gpus == 1]
    assert singles and all(c.distributed_backend == "NONE" and c.fsdp_version is None for c in singles)
    ddp = [c for c in configs if c.distributed_backend == "DDP"]
    assert ddp and all(c.fsdp_sharding_strategy is None for c in ddp)
    fsdp = [c for c in configs if c.distributed_backend == "FSDP"]
    assert {(c.fsdp_version, c.fsdp_sharding_strategy) for c in fsdp} == {
        (1, "FULL_SHARD"),
        (1, "SHARD_GRAD_OP"),
        (2, "FULL_SHARD"),
        (2, "SHARD_GRAD_OP"),
    }
    # 2 batch sizes x 2 checkpointing x (1 single + 1 DDP + 4 FSDP) = 24 distinct configurations
    assert len(configs) == 24 == len(set(configs))
    study = optuna.create_study()
    for _ in range(20):
        trial = study.ask()
        config = space.suggest(trial)
        has_fsdp_params = {"fsdp_version", "fsdp_sharding_strategy"} <= set(trial.params)
        assert has_fsdp_params == (config.distributed_backend == "FSDP")
        assert ("distributed_backend" in trial.params) == (config.number_gpus > 1)
        study.tell(trial, 0.0)


def _config(**kw) -> TrialConfig:
    base = dict(
        batch_size=8,
        number_gpus=2,
        distributed_backend="DDP",
        gradient_checkpointing=False,
        model_max_length=64,
    )
    return TrialConfig(**(base | kw))


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (_config(), None),
        (_config(batch_size=6, number_gpus=4), "not divisible by number_gpus"),
        (_config(batch_size=9), "not divisible by number_gpus"),
        (_config(batch_size=8, number_gpus=4), "exceeds the 2 GPUs"),
        (_config(batch_size=0), "less than 1"),
        (
            _config(distributed_backend="FSDP", fsdp_version=2, fsdp_sharding_strategy="NO_SHARD"),
            "FSDP2 has no NO_SHARD",
        ),
        (_config(distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="NO_SHARD"), None),
    ],
)
def test_is_valid_rules(config, reason):
    resources = ResourcesSpec(gpus_per_node=2, gpu_model="X")
    got = invalid_reason(config, resources)
    assert (got is None) if reason is None else (reason in (got or ""))


def test_empty_gpu_model_is_invalid():
    # The study file refuses an empty gpu_model (resources.gpu_model); the rule stays for specs
    # built in code.
    with pytest.raises(ValidationError, match="empty or blank"):
        ResourcesSpec(gpus_per_node=2, gpu_model="")
    resources = ResourcesSpec.model_construct(gpus_per_node=2, nodes=1, gpu_model="")
    assert "gpu_model" in (invalid_reason(_config(), resources) or "")


def test_trial_config_key_and_dict_round_trip():
    c = _config(distributed_backend="FSDP", fsdp_version=1, fsdp_sharding_strategy="FULL_SHARD")
    assert TrialConfig.from_dict(c.to_dict()) == c
    assert c.key().startswith("batch_size.8-number_gpus.2-distributed_backend.FSDP")
    assert c.per_device_batch_size == 4
    with pytest.raises(ValueError, match="unknown"):
        TrialConfig.from_dict(c.to_dict() | {"nope": 1})


def test_number_nodes_is_a_parameter_of_multi_gpu_trials():
    params = BASE_STUDY["search_space"]["parameters"] | {
        "number_gpus": {"values": [1, 2, 4]},
        "number_nodes": {"values": [1, 2]},
    }
    space = _space(params)
    configs = list(space.enumerate())
    assert {c.number_nodes for c in configs if c.number_gpus == 1} == {1}  # never asked on one GPU
    assert {(c.number_gpus, c.number_nodes) for c in configs} >= {(2, 1), (2, 2), (4, 2)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    for _ in range(30):
        trial = study.ask()
        config = space.suggest(trial)
        assert ("number_nodes" in trial.params) == (config.number_gpus > 1)
        assert space.params_for(config) == trial.params
        study.tell(trial, 1.0)
    resources = ResourcesSpec(gpus_per_node=2, nodes=2, gpu_model="X")
    c = TrialConfig(
        batch_size=4,
        number_gpus=4,
        number_nodes=2,
        distributed_backend="DDP",
        gradient_checkpointing=False,
        model_max_length=64,
    )
    assert invalid_reason(c, resources) is None
    assert "4 GPUs per node exceeds gpus_per_node 2" in (
        invalid_reason(TrialConfig(**{**c.to_dict(), "number_nodes": 1}), resources) or ""
    )
    assert "not divisible by number_nodes" in (
        invalid_reason(TrialConfig(**{**c.to_dict(), "number_gpus": 2, "number_nodes": 4}), resources) or ""
    )
    assert "exceeds the 2 nodes" in (
        invalid_reason(TrialConfig(**{**c.to_dict(), "number_nodes": 4}), resources) or ""
    )
    assert "number_nodes.2" in c.key() and "gpus=4 nodes=2" in describe(c)
    with pytest.raises(SpecError, match="number_nodes needs number_gpus > 1, but number_gpus is only 1"):
        _space({**{k: v for k, v in params.items() if k != "distributed_backend"}, "number_gpus": 1})


OFFLOAD_SPACE = BASE_STUDY["search_space"]["parameters"] | {"fsdp_cpu_offload": {"choices": [False, True]}}


def test_fsdp_with_cpu_offload_is_a_configuration_of_one_gpu():
    """FSDP with CPU offload on one GPU (an 8B full fine-tune on one card): asked where the space
    can offload; DDP on one GPU is the single process; FSDP there is valid only with offload."""
    space = _space(OFFLOAD_SPACE)
    resources = ResourcesSpec(gpus_per_node=2, gpu_model="X")
    singles = [c for c in space.enumerate() if c.number_gpus == 1]
    assert {c.distributed_backend for c in singles} == {"NONE", "FSDP"}
    valid = [c for c in singles if invalid_reason(c, resources) is None]
    # 2 batches x 2 checkpointing x (1 single process + 4 FSDP versions/strategies with offload)
    assert len(valid) == 20 and all(c.fsdp_cpu_offload for c in valid if c.distributed_backend == "FSDP")
    alone = next(c for c in singles if c.distributed_backend == "FSDP" and not c.fsdp_cpu_offload)
    assert "only with fsdp_cpu_offload" in (invalid_reason(alone, resources) or "")
    # without offload in the space, one GPU is the single process only, as before
    plain = [c for c in _space(BASE_STUDY["search_space"]["parameters"]).enumerate() if c.number_gpus == 1]
    assert len(plain) == 4 and {c.distributed_backend for c in plain} == {"NONE"}


def test_one_gpu_configurations_round_trip_where_the_backend_is_asked():
    """The single process of a space that asks the backend on one GPU is asked as DDP (which
    settles to NONE), so that an enqueued configuration comes back as itself."""
    space = _space(OFFLOAD_SPACE | {"number_gpus": 1})
    single = TrialConfig(batch_size=4, number_gpus=1, gradient_checkpointing=False, model_max_length=64)
    assert TrialConfig(**(single.to_dict() | {"distributed_backend": "DDP"})) == single
    assert space.params_for(single)["distributed_backend"] == "DDP"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask()
        config = space.suggest(trial)
        assert space.params_for(config) == trial.params
        study.tell(trial, 1.0)
    study.enqueue_trial(space.params_for(single))
    assert space.suggest(study.ask()).distributed_backend == "NONE"


def test_one_gpu_spaces_take_the_backend_only_with_offload():
    one = BASE_STUDY["search_space"]["parameters"] | {"number_gpus": 1}
    _space(one | {"distributed_backend": "FSDP", "fsdp_cpu_offload": True})  # accepted
    with pytest.raises(SpecError, match="distributed_backend needs number_gpus > 1"):
        _space(one | {"distributed_backend": "FSDP"})
