from pydantic import BaseModel

from trainwise.config import RunConfig, config_from_dict, parse_value
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
