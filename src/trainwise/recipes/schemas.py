"""Typed arguments of the built-in model and data builders: `model.args` / `data.args` are checked against
these when a recipe is loaded (`load_recipe`) and again when the model or data is built (a RunConfig made in
Python skips the loader), so a wrong shape is refused with the allowed one before anything runs (a bare
`channels: 7` used to surface as "'int' object is not iterable" deep inside the model).

The check lives here, not in config.py's validators, because the config is the foundation every room
imports and imports no room (tests/test_architecture.py). The builders live in models.py and datasets.py;
tests/recipes/test_schemas.py keeps them and these schemas in step.
"""
from __future__ import annotations

import difflib
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WrapValidator, model_validator
from pydantic_core import PydanticCustomError

from trainwise.config import RunConfig
from trainwise.config.messages import name_overrides
from trainwise.errors import ConfigError

# Upper bounds only catch typos and integer overflow inside torch; they stay far above what fits, because
# `trainwise plan` is asked about models too large for any card (a model that cannot be allocated is
# reported when it is built, see factories.py).
MAX_WIDTH = 2**20
MAX_CHANNELS = 2**16
MAX_LAYERS = 64


def _explained(expected: str):
    """A field validator that replaces pydantic's message with what the field takes and what it got."""

    def check(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("builtin_arg", "expected {expected}; got {got}",
                                      {"expected": expected, "got": _shown(value)}) from None

    return WrapValidator(check)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


Width = Annotated[int, Field(strict=True, ge=1, le=MAX_WIDTH)]
Channels = Annotated[int, Field(strict=True, ge=1, le=MAX_CHANNELS)]
Dropout = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False),
                    _explained("a number in [0, 1), e.g. 0.1")]


class BuilderArgs(BaseModel):
    """Base of every schema: unknown keys are refused with the accepted ones listed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    builder: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        accepted = list(cls.model_fields)
        unknown = [key for key in raw if key not in accepted]
        if not unknown:
            return raw
        if not accepted:
            raise PydanticCustomError("builtin_arg", "{builder} takes no arguments (got {keys}); remove them",
                                      {"builder": cls.builder, "keys": ", ".join(map(repr, unknown))})
        close = difflib.get_close_matches(str(unknown[0]), accepted, n=1)
        raise PydanticCustomError("builtin_arg", "{builder} takes no argument {key}.{hint} It accepts: {takes}.",
                                  {"builder": cls.builder, "key": repr(unknown[0]), "takes": ", ".join(accepted),
                                   "hint": f" Did you mean {close[0]!r}?" if close else ""})


class CnnArgs(BuilderArgs):
    builder: ClassVar[str] = "cnn"
    channels: Annotated[tuple[Channels, ...], Field(min_length=1, max_length=MAX_LAYERS),
                        _explained(f"a list of 1 to {MAX_LAYERS} positive ints (at most {MAX_CHANNELS}), "
                                   "e.g. [32, 64]")] = (32, 64)
    hidden: Annotated[Width, _explained(f"a positive int (at most {MAX_WIDTH}), e.g. 128")] = 128
    dropout: Dropout = 0.1
    pooled_size: Annotated[int, Field(strict=True, ge=1, le=16),
                           _explained("an int from 1 to 16, e.g. 4")] = 4


class MlpArgs(BuilderArgs):
    builder: ClassVar[str] = "mlp"
    hidden: Annotated[tuple[Width, ...], Field(max_length=MAX_LAYERS),
                      _explained(f"a list of up to {MAX_LAYERS} positive ints (at most {MAX_WIDTH}), "
                                 "e.g. [64, 32]; [] is a linear model")] = (64, 32)
    dropout: Dropout = 0.1


class DigitsArgs(BuilderArgs):
    builder: ClassVar[str] = "digits"  # splits, seed and augmentation come from data.* fields


class BreastCancerArgs(BuilderArgs):
    builder: ClassVar[str] = "breast_cancer"


class PreparedArgs(BuilderArgs):
    builder: ClassVar[str] = "prepared"
    normalize: Annotated[bool, Field(strict=True), _explained("true or false")] = True


# recommenders (recsys/models.py) and their data (recsys/data.py)
Size = Annotated[int, Field(strict=True, ge=1, le=MAX_WIDTH), _explained(f"a positive int (at most {MAX_WIDTH})")]
Layers = Annotated[int, Field(strict=True, ge=1, le=MAX_LAYERS), _explained(f"an int from 1 to {MAX_LAYERS}")]
Count = Annotated[int, Field(strict=True, ge=1, le=2**31), _explained("a positive int, e.g. 1000")]
Switch = Annotated[bool, Field(strict=True), _explained("true or false")]


NextItemLoss = Annotated[Literal["full", "sampled"], _explained("full (softmax over every item) or sampled "
                                                               "(num_sampled negatives per batch)")]
Sampling = Annotated[Literal["uniform", "popularity"], _explained("uniform or popularity (with the logQ correction)")]


class SasrecArgs(BuilderArgs):
    builder: ClassVar[str] = "sasrec"
    hidden: Size = 64
    layers: Layers = 2
    heads: Layers = 1
    dropout: Dropout = 0.2
    loss: NextItemLoss = "full"
    num_sampled: Count = 1000
    sampling: Sampling = "uniform"
    sparse_embeddings: Switch = False


class Gru4recArgs(BuilderArgs):
    builder: ClassVar[str] = "gru4rec"
    hidden: Size = 64
    layers: Layers = 1
    dropout: Dropout = 0.2
    loss: NextItemLoss = "full"
    num_sampled: Count = 1000
    sampling: Sampling = "uniform"
    sparse_embeddings: Switch = False


class PopularityArgs(BuilderArgs):
    builder: ClassVar[str] = "popularity"


class DinArgs(BuilderArgs):
    builder: ClassVar[str] = "din"
    hidden: Size = 32
    attention_hidden: Size = 36
    mlp: Annotated[tuple[Width, ...], Field(max_length=MAX_LAYERS),
                   _explained("a list of positive ints, e.g. [80, 40]")] = (80, 40)
    attention: Switch = True
    dropout: Dropout = 0.0


class ShopArgs(BuilderArgs):
    builder: ClassVar[str] = "shop"
    objective: Annotated[Literal["next_item", "ctr"], _explained("next_item (sasrec, gru4rec, popularity) or "
                                                                  "ctr (din)")] = "next_item"
    max_len: Annotated[int, Field(strict=True, ge=1, le=4096), _explained("an int from 1 to 4096, e.g. 50")] = 50
    negatives: Annotated[int, Field(strict=True, ge=1, le=1000), _explained("an int from 1 to 1000")] = 1
    max_eval_queries: Count = 5000
    split: Annotated[Literal["last-k", "time"], _explained("last-k or time")] = "last-k"
    users: Count = 20_000
    items: Count = 5_000
    events: Count = 1_000_000
    categories: Count = 50
    behaviours: Annotated[bool | None, Field(strict=True), _explained(
        "true, false or null (null: when a prepared log has an event column)")] = None
    data_seed: Annotated[int | None, Field(strict=True, ge=0, le=2**32 - 1), _explained(
        "an int from 0 to 2**32-1, or null (null: follow the run's seed)")] = 0


# the built-in language model (text/gpt.py) and the corpus that ships with Python (data/text/bundle.py)
class GptArgs(BuilderArgs):
    builder: ClassVar[str] = "gpt"
    layers: Layers = 4
    heads: Annotated[int, Field(strict=True, ge=1, le=1024), _explained("an int from 1 to 1024 dividing width")] = 4
    width: Size = 128
    context: Annotated[int | None, Field(strict=True, ge=2, le=2**17), _explained(
        "an int from 2 to 131072, or null (null: data.seq_len)")] = None
    dropout: Dropout = 0.0
    bias: Switch = True


class PydocTopicsArgs(BuilderArgs):
    builder: ClassVar[str] = "pydoc_topics"
    train_tokenizer: Annotated[int | None, Field(strict=True, ge=258, le=2**20), _explained(
        "null (byte-level) or a BPE vocabulary size from 258, e.g. 8000")] = None


MODEL_ARGS: dict[str, type[BuilderArgs]] = {"cnn": CnnArgs, "mlp": MlpArgs, "sasrec": SasrecArgs,
                                            "gru4rec": Gru4recArgs, "popularity": PopularityArgs, "din": DinArgs,
                                            "gpt": GptArgs}
DATA_ARGS: dict[str, type[BuilderArgs]] = {"digits": DigitsArgs, "breast_cancer": BreastCancerArgs,
                                           "prepared": PreparedArgs, "shop": ShopArgs,
                                           "pydoc_topics": PydocTopicsArgs}


def args_schema(kind: str, name: str | None, factory: str | None) -> type[BuilderArgs] | None:
    """The schema for `model.args` (kind "model") or `data.args` (kind "data"). None for a user's factory,
    whose arguments are its own business, and for an unknown name, which `unknown_builtin` reports."""
    if factory:
        return None
    if kind == "data" and name is None:
        return PreparedArgs  # no name: a prepared directory given by data.path
    return (MODEL_ARGS if kind == "model" else DATA_ARGS).get(name)  # type: ignore[arg-type]


def unknown_builtin(kind: str, name: str | None, factory: str | None) -> str | None:
    """Why `model.name` / `data.name` names nothing that can be built, or None when it does."""
    known = MODEL_ARGS if kind == "model" else DATA_ARGS
    if factory or name in known or (kind == "data" and name is None):
        return None
    what = "model" if kind == "model" else "data set"
    return (f"unknown built-in {what} {name!r}; use one of {', '.join(known)}, "
            f"or set {kind}.factory to your own `package.module:function`")


def check_builders(config: RunConfig, source: str, overrides: list[str] = ()) -> None:
    """The built-in model and data a config names exist and get arguments of their schemas' shapes; one
    ConfigError listing every problem, in the form of the config's own: a key the command line set names its
    override, else the recipe file (`SOURCE: invalid configuration`)."""
    problems = []
    for kind, section in (("model", config.model), ("data", config.data)):
        if kind == "model" and (section.hf or section.hf_config or (section.name is None and not section.factory)):
            # a Hugging Face model (model.name and args unused), or one still to be named (sft-lora's model.hf):
            # building says what to set
            continue
        unknown = unknown_builtin(kind, section.name, section.factory)
        if unknown:
            problems.append(f"{kind}.name: {unknown}")
            continue
        schema = args_schema(kind, section.name, section.factory)
        try:
            checked_args(schema, section.args)
        except ValidationError as error:
            problems += describe_args_error(error, f"{kind}.args").splitlines()
    if problems:
        raise ConfigError(name_overrides(problems, source, overrides))


def checked_args(schema: type[BuilderArgs] | None, args: dict[str, Any]) -> dict[str, Any]:
    """`args` validated by `schema` (raises pydantic's ValidationError), as the keywords to call with."""
    if schema is None:
        return dict(args)
    return schema.model_validate(args).model_dump(mode="json", exclude_unset=True)  # lists, as YAML gives


def describe_args_error(error: ValidationError, field: str) -> str:
    """One line per problem, each naming the dotted key: `model.args.channels: expected ...; got 7`."""
    lines = []
    for item in error.errors():
        where = ".".join([field, *(str(part) for part in item["loc"])])
        lines.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)
