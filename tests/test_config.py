import math

import pytest
from pydantic import BaseModel

from trainwise.config import (DataConfig, EvalConfig, RunConfig, TrainConfig, config_from_dict, lower_is_better,
                              parse_value)
from trainwise.errors import ConfigError, DataError
from trainwise.recipes import list_recipes, load_recipe


def _models(model=RunConfig, prefix=""):
    yield prefix, model
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _models(info.annotation, f"{prefix}{name}.")


def test_every_field_is_described():
    missing = [f"{prefix}{name}" for prefix, model in _models() for name, info in model.model_fields.items()
               if not info.description and not (isinstance(info.annotation, type)
                                                and issubclass(info.annotation, BaseModel))]
    assert missing == []


def test_overrides_are_typed_like_yaml():
    assert parse_value("3e-4") == 3e-4
    assert parse_value("[8, 16]") == [8, 16]
    assert parse_value("null") is None
    assert parse_value("true") is True
    config = config_from_dict({"train": {"max_steps": 5}}, overrides=["train.batch_size=16", "optim.betas=[0.9,0.95]"])
    assert config.train.batch_size == 16 and config.optim.betas == (0.9, 0.95)


def test_every_builtin_recipe_loads_and_round_trips():
    for name in list_recipes():
        config = load_recipe(name)
        assert config_from_dict(config.model_dump(mode="json")) == config


def test_monitor_mode_follows_the_metric():
    assert config_from_dict({"eval": {"monitor": "val/loss"}}).eval.monitor_mode == "min"
    assert config_from_dict({"eval": {"monitor": "val/accuracy"}}).eval.monitor_mode == "max"
    assert config_from_dict({"eval": {"monitor": "val/accuracy", "mode": "min"}}).eval.monitor_mode == "min"


# ---- decisions config owns -----------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["val/loss", "loss", "val/log_loss", "test/ece", "val/mae", "val/rmse",
                                    "val/mse", "test/median_rank", "val/error_rate"])
def test_lower_is_better_for_losses_errors_calibration_and_ranks(metric):
    assert lower_is_better(metric)
    assert EvalConfig(monitor=metric).monitor_mode == "min"


@pytest.mark.parametrize("metric", ["val/accuracy", "val/balanced_accuracy", "test/roc_auc", "test/pr_auc",
                                    "test/r2", "test/mrr", "test/hr@10", "test/ndcg@10", "test/macro_f1",
                                    "test/precision", "test/recall"])
def test_higher_is_better_for_everything_else(metric):
    assert not lower_is_better(metric)
    assert EvalConfig(monitor=metric).monitor_mode == "max"


def test_steps_per_epoch_drop_the_partial_batch_as_the_sampler_does():
    train = TrainConfig(batch_size=32, epochs=1.5)
    assert train.steps_per_epoch(100) == 3  # 96 samples a pass; the last 4 never make a step
    assert train.total_steps(100) == math.ceil(1.5 * 3)
    assert TrainConfig(batch_size=32, max_steps=7, epochs=2).total_steps(100) == 7  # max_steps wins
    with pytest.raises(DataError, match="10 samples, fewer than one batch"):
        train.steps_per_epoch(10)


@pytest.mark.parametrize("value, phrases", [
    (-1, ["data.num_workers", "-1 workers", "auto"]),
    (2147483648, ["data.num_workers", "2 per usable core", "auto"]),
    ("many", ["data.num_workers"]),
])
def test_num_workers_out_of_range_is_a_config_error(value, phrases):
    with pytest.raises(ConfigError) as error:
        config_from_dict({"data": {"num_workers": value}})
    assert all(p in str(error.value) for p in phrases), str(error.value)


def test_num_workers_accepts_auto_zero_and_counts():
    for value in ("auto", 0, 4):
        assert DataConfig(num_workers=value).num_workers == value


def test_warning_temperature_must_be_below_failure_in_a_recipe():
    with pytest.raises(ConfigError, match="must be below the failure temperature"):
        config_from_dict({"telemetry": {"temperature_warn_c": 95}})


def test_a_bad_override_is_named_as_the_override_not_blamed_on_the_recipe_file():
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"train": {"max_steps": 5}}, source="recipe.yaml", overrides=["train.batch_size=abc"])
    message = str(caught.value)
    assert message.startswith("invalid override on the command line (recipe recipe.yaml)")
    assert "train.batch_size: Input should be a valid integer" in message
    assert "(given by the override 'train.batch_size=abc')" in message


def test_a_cross_field_problem_names_the_override_that_made_it():
    raw = {"train": {"max_steps": 20}, "schedule": {"warmup_steps": 20}}
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw, source="recipe.yaml", overrides=["train.max_steps=20"])
    message = str(caught.value)
    assert message.startswith("invalid override on the command line (recipe recipe.yaml)")
    assert "must be smaller than train.max_steps (20)" in message
    assert message.endswith("(given by the override 'train.max_steps=20')")


def test_a_bad_value_in_the_recipe_itself_still_names_the_recipe_file():
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"train": {"batch_size": "abc"}}, source="recipe.yaml", overrides=["optim.lr=0.1"])
    message = str(caught.value)
    assert message.startswith("recipe.yaml: invalid configuration")
    assert "given by the override" not in message


def test_language_model_fields_parse_from_overrides_and_refuse_two_sources():
    config = load_recipe("digits", ["model.hf_config=gpt2", "model.method=lora", "model.lora.rank=8",
                                    "model.lora.target_modules=[q_proj,v_proj]", "data.seq_len=256"])
    assert config.model.method == "lora" and config.model.lora.rank == 8 and config.data.seq_len == 256
    assert config.model.lora.target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="not both"):
        load_recipe("digits", ["model.hf=/models/x", "model.hf_config=gpt2"])
    with pytest.raises(ConfigError, match="method"):
        load_recipe("digits", ["model.method=prefix"])
