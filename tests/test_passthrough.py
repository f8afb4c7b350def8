"""``workload.training_arguments``: extra TrainingArguments reach every trial; a field that is
unknown, decided by explorer, or refused by transformers is one line at validation."""

from __future__ import annotations

import pytest

from explorer.errors import SpecError
from explorer.passthrough import check_training_arguments, reserved_reason
from tests.builders import run_cli


def test_a_study_passes_training_arguments_to_its_trials(write_study, tmp_path):
    import optuna

    study = write_study(
        {
            "n_trials": 1,
            "workload": {"training_arguments": {"dataloader_num_workers": 2}},
            "search_space": {
                "parameters": {
                    "batch_size": 4,
                    "number_gpus": 1,
                    "gradient_checkpointing": False,
                }
            },
        }
    )
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    proc = run_cli("optimize", str(study), "--storage", storage, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (trial,) = optuna.load_study(study_name="test", storage=storage).get_trials(deepcopy=False)
    assert trial.user_attrs["status"] == "ok", trial.user_attrs.get("error")
    assert trial.user_attrs["training_arguments"] == {"dataloader_num_workers": 2}


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"dataloader_num_worker": 2}, "dataloader_num_worker", "did you mean dataloader_num_workers"),
        ({"optim": "adafactor"}, "optim", "knob optim"),
        ({"per_device_train_batch_size": 8}, "per_device_train_batch_size", "trial's configuration"),
        ({"max_steps": 100}, "max_steps", "measurement"),
    ],
)
def test_a_field_that_cannot_pass_through_is_named(values, field, words):
    with pytest.raises(SpecError) as err:
        check_training_arguments(values, file="s.yaml")
    assert f"workload.training_arguments.{field}" in str(err.value) and words in str(err.value)


def test_a_value_transformers_refuses_is_one_line():
    with pytest.raises(SpecError) as err:
        check_training_arguments({"lr_scheduler_type": "sideways"}, file="s.yaml")
    text = str(err.value)
    assert "TrainingArguments refuses it" in text and "\n" not in text


def test_fields_explorer_leaves_to_the_study_pass():
    check_training_arguments({"dataloader_num_workers": 2, "learning_rate": 3e-4}, file="s.yaml")
    assert reserved_reason("learning_rate") is None
