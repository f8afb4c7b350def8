"""Heterogeneous clusters: ``gpu_model`` as a searched knob over ``resources.gpu_models``.

Real parts only: the spec and the loader, the placement accounting, a local Ray with logical GPUs
of two declared models running real tiny trials, and a replayed study over a two-model table.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from explorer.errors import SpecError
from explorer.launch import ModelPlacement, accelerator_type
from explorer.launch._placement import Share, fits_on_nodes, local_resources, node_capacity
from explorer.search import inferred_oom, throughput_dominates
from explorer.spec import ResourcesSpec
from explorer.study import config_of, open_study, optimize, status_of
from explorer.study_file import load_study
from explorer.trial_config import TrialConfig
from explorer.validity import invalid_reason

TWO = {"CPU-small": 1, "CPU-large": 1}


def _two_model_study(write_study, tmp_path: Path, **patch):
    return write_study(
        {
            "storage": f"sqlite:///{tmp_path}/s.db",
            "sampler": {"kind": "grid"},
            "n_trials": 2,
            "parallel_trials": 2,
            "resources": {"gpus_per_node": 1, "gpu_models": TWO, "gpu_model": None},
            "launcher": {"kind": "ray", "warm_start": False},
            "search_space": {
                "parameters": {
                    "gpu_model": {"choices": ["CPU-small", "CPU-large"]},
                    "batch_size": 4,
                    "number_gpus": 1,
                    "gradient_checkpointing": False,
                }
            },
            **patch,
        }
    )


# -- the knob and the study file --------------------------------------------------------------


def test_a_study_that_does_not_search_it_keeps_its_keys_and_configurations():
    c = TrialConfig(batch_size=4, number_gpus=1, gradient_checkpointing=False, model_max_length=64)
    assert c.gpu_model is None and "gpu_model" not in c.key()
    assert "gpu_model.CPU-large" in c.replace(gpu_model="CPU-large").key()


def test_gpu_model_defaults_to_the_first_declared_model_and_contradictions_are_refused():
    assert ResourcesSpec.model_validate({"gpu_models": TWO}).gpu_model == "CPU-small"
    r = ResourcesSpec.model_validate({"gpu_models": TWO, "gpu_model": "CPU-large"})
    assert r.gpus_of(None) == 1 and r.model_of(None) == "CPU-large" and r.total_gpus == 2
    with pytest.raises(ValueError, match="does not declare resources.gpu_model 'CPU-medium'"):
        ResourcesSpec.model_validate({"gpu_models": TWO, "gpu_model": "CPU-medium"})


def test_a_searched_model_that_is_not_declared_is_one_line(write_study, tmp_path):
    path = _two_model_study(
        write_study,
        tmp_path,
        search_space={
            "parameters": {
                "gpu_model": {"choices": ["CPU-small", "CPU-smal"]},
                "batch_size": 4,
                "number_gpus": 1,
                "gradient_checkpointing": False,
            }
        },
    )
    with pytest.raises(SpecError) as err:
        load_study(path, check_model=False)
    assert err.value.field == "parameters.gpu_model"
    assert "'CPU-smal' is not a GPU model of resources.gpu_models" in err.value.problem


def test_two_models_of_one_ray_accelerator_type_are_refused_on_a_cluster(write_study, tmp_path):
    path = _two_model_study(
        write_study,
        tmp_path,
        resources={
            "gpus_per_node": 1,
            "gpu_models": {"NVIDIA-H100-80GB-HBM3": 8, "NVIDIA-H100-NVL": 8},
            "gpu_model": None,
        },
        launcher={"kind": "ray", "address": "127.0.0.1:1"},
        search_space={
            "parameters": {
                "gpu_model": {"choices": ["NVIDIA-H100-80GB-HBM3"]},
                "batch_size": 4,
                "number_gpus": 1,
                "gradient_checkpointing": False,
            }
        },
    )
    with pytest.raises(SpecError) as err:
        load_study(path, check_model=False)
    assert err.value.field == "resources.gpu_models" and "Ray accelerator type 'H100'" in err.value.problem


def test_each_model_has_its_own_gpus_and_no_inference_crosses_models():
    r = ResourcesSpec.model_validate({"gpus_per_node": 8, "gpu_models": {"A": 8, "B": 2}})
    a = TrialConfig(
        batch_size=8,
        number_gpus=4,
        distributed_backend="DDP",
        gradient_checkpointing=False,
        model_max_length=64,
        gpu_model="A",
    )
    assert invalid_reason(a, r) is None
    assert "exceeds the 2 GPUs of B" in str(invalid_reason(a.replace(gpu_model="B"), r))
    assert "not one of resources.gpu_models" in str(invalid_reason(a.replace(gpu_model="C"), r))
    big_b = a.replace(gpu_model="B", batch_size=64)
    assert inferred_oom(big_b, [(0, a)]) is None  # an OOM on A says nothing of B
    assert inferred_oom(a.replace(batch_size=64), [(0, a)]) == 0
    assert not throughput_dominates(a, a.replace(gpu_model="B"))


# -- placement accounting ---------------------------------------------------------------------


def test_accelerator_types_are_derived_as_ray_derives_them():
    assert accelerator_type("NVIDIA-H100-80GB-HBM3") == "H100"
    assert accelerator_type("NVIDIA-A100-SXM4-80GB") == "A100"
    assert accelerator_type("CPU-small") == "CPU-small"


def test_placement_requests_and_node_capacity_per_model():
    single = ModelPlacement.single("CPU-logical")
    assert single.request(2) == {"CPU-logical": 2}  # as before: one model, one custom resource
    assert single.capacity({"GPU": 4, "CPU-logical": 2}) == 2
    cluster = ModelPlacement.typed("NVIDIA-H100-80GB-HBM3", local=False)
    assert cluster.request(8) == {"accelerator_type:H100": 0.001}
    assert cluster.capacity({"GPU": 8, "accelerator_type:H100": 1}) == 8
    assert cluster.capacity({"GPU": 8, "accelerator_type:A100": 1}) == 0
    small, large = (ModelPlacement.typed(m, local=True) for m in ("CPU-small", "CPU-large"))
    node = local_resources([small, large], {"CPU-small": 2, "CPU-large": 1})
    assert node == {
        "CPU-small": 2,
        "accelerator_type:CPU-small": 1,
        "CPU-large": 1,
        "accelerator_type:CPU-large": 1,
    }
    node["GPU"] = 3
    assert small.capacity(node) == 2 and large.capacity(node) == 1  # one node, two models' GPUs
    # a running trial of the other model is not counted against this one's GPUs
    assert fits_on_nodes({"n": 1}, [], number_gpus=1, number_nodes=1)
    assert not fits_on_nodes({"n": 1}, [Share("n", 1)], number_gpus=1, number_nodes=1)


def test_node_capacity_reads_the_local_rays_models():
    import ray

    small, large = (ModelPlacement.typed(m, local=True) for m in ("CPU-small", "CPU-large"))
    ray.init(
        num_gpus=3,
        resources=local_resources([small, large], {"CPU-small": 2, "CPU-large": 1}),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        assert list(node_capacity(small).values()) == [2]
        assert list(node_capacity(large).values()) == [1]
        assert node_capacity(ModelPlacement.typed("NVIDIA-H100-80GB-HBM3", local=False)) == {}
    finally:
        ray.shutdown()


# -- real studies -----------------------------------------------------------------------------


@pytest.mark.slow  # a real two-model study on the local Ray: about 35 s (CI runs it with make test-slow)
def test_a_cpu_study_runs_trials_of_both_models_on_their_own_gpus(write_study, tmp_path):
    """Local Ray, one logical GPU of each model, two trials at once: one per model, each placed
    on its model's resources (as Ray assigned them to the trial's actor)."""
    import ray

    loaded = load_study(_two_model_study(write_study, tmp_path))
    optimize(loaded, printer=lambda line: None)
    assert not ray.is_initialized()
    trials = open_study(loaded, create=False).get_trials()
    assert sorted(config_of(t).gpu_model for t in trials) == ["CPU-large", "CPU-small"]
    for t in trials:
        model = t.user_attrs["gpu_model"]
        assert status_of(t) == "ok", t.user_attrs.get("error")
        assert t.user_attrs["ray_resources"] == {
            "GPU": 1.0,
            model: 1.0,
            f"accelerator_type:{model}": pytest.approx(0.001),
        }
    from explorer.export import export_rows

    assert sorted(r["gpu_model"] for r in export_rows(loaded)) == ["CPU-large", "CPU-small"]


def test_a_replayed_study_matches_rows_on_each_trials_gpu_model(write_study, tmp_path):
    rows = [
        dict(
            model_name="tiny-llama",
            gpu_model=m,
            model_max_length=64,
            number_gpus=1,
            batch_size=bs,
            gradient_checkpointing=False,
            dataset_tokens_per_second_per_gpu=tput,
            is_valid=1,
        )
        for m, base in (("CPU-small", 100.0), ("CPU-large", 300.0))
        for bs, tput in ((4, base), (8, base + 10))
    ]
    with (tmp_path / "table.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    path = _two_model_study(
        write_study,
        tmp_path,
        n_trials=4,
        launcher={"kind": "replay", "table": "table.csv"},
        search_space={
            "parameters": {
                "gpu_model": {"choices": ["CPU-small", "CPU-large"]},
                "batch_size": {"values": [4, 8]},
                "number_gpus": 1,
                "gradient_checkpointing": False,
            }
        },
    )
    loaded = load_study(path)
    optimize(loaded, printer=lambda line: None)
    trials = open_study(loaded, create=False).get_trials()
    want = {(r["gpu_model"], r["batch_size"]): r["dataset_tokens_per_second_per_gpu"] for r in rows}
    got = {(config_of(t).gpu_model, config_of(t).batch_size): t.values[0] for t in trials}
    assert got == want


def test_the_example_study_validates():
    from explorer.cli import main

    study = Path(__file__).resolve().parents[1] / "studies" / "quickstart-two-models.yaml"
    assert main(["validate", str(study)]) in (0, None)


def test_the_dashboard_notes_name_every_gpu_model():
    """The study's user attrs (and the dashboard note made of them) list each declared GPU model
    with its GPUs, not only the default one."""
    from explorer.study._notes import study_attrs, study_note

    root = Path(__file__).resolve().parents[1]
    loaded = load_study(root / "studies" / "quickstart-two-models.yaml", check_model=False)
    models = loaded.spec.resources.gpu_models
    assert models and len(models) == 2
    shown = ", ".join(f"{m}: {n} GPUs" for m, n in models.items())
    assert study_attrs(loaded)["gpu_model"] == shown
    assert f"- **gpu_model**: {shown}" in study_note(loaded)
    assert "by dataset tokens per second per gpu (maximized)" in study_note(loaded)
