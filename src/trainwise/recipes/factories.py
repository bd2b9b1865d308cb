"""Build the model and the data a RunConfig names: built-ins by name, the user's own by `module:attr`.

User factories are imported by explicit `package.module:function` only; nothing is evaluated.
"""
from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from torch import nn

from trainwise.config import RunConfig
from trainwise.data.bundle import DataBundle, DataSpec
from trainwise.errors import ConfigError
from trainwise.recipes.datasets import BUILTIN_DATA
from trainwise.recipes.models import BUILTIN_MODELS

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def import_factory(reference: str, field: str) -> Callable[..., Any]:
    """`package.module:function` → the function; a clear error naming `field` when it cannot be had."""
    if not _FACTORY.match(reference):
        raise ConfigError(f"{field}: {reference!r} is not of the form package.module:function.")
    module_name, _, attr_path = reference.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{field}: cannot import module {module_name!r} ({e}). Is the package installed, "
                          "or its directory on PYTHONPATH?") from None
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise ConfigError(f"{field}: module {module_name!r} has no attribute {attr_path!r}.")
        target = getattr(target, attr)
    if not callable(target):
        raise ConfigError(f"{field}: {reference!r} is not callable.")
    return target


def build_data(config: RunConfig) -> DataBundle:
    data = config.data
    common = dict(seed=config.seed)
    if data.factory:
        build = import_factory(data.factory, "data.factory")
        bundle = _call(build, "data.factory", {**data.args, **common})
        if not isinstance(bundle, DataBundle):
            raise ConfigError(f"data.factory: {data.factory} returned {type(bundle).__name__}, "
                              "expected a trainwise.DataBundle.")
        return bundle
    if data.name == "prepared" or (data.path and data.name in (None, "prepared")):
        if not data.path:
            raise ConfigError("data.path: a prepared dataset needs its directory (from `trainwise prepare`).")
        from trainwise.data.prepared import prepared_bundle

        return prepared_bundle(data.path, augment=data.augment, **data.args)
    if data.name not in BUILTIN_DATA:
        raise ConfigError(f"data.name: unknown data set {data.name!r}. Built-in: "
                          f"{', '.join(sorted(BUILTIN_DATA))}, prepared; or set data.factory.")
    return _call(BUILTIN_DATA[data.name], "data.args", {
        **data.args, **common, "val_fraction": data.val_fraction, "test_fraction": data.test_fraction,
        "augment": data.augment})


def build_model(config: RunConfig, spec: DataSpec) -> nn.Module:
    model_config = config.model
    if model_config.factory:
        build = import_factory(model_config.factory, "model.factory")
        kwargs = dict(model_config.args)
        if "data_spec" in inspect.signature(build).parameters:
            kwargs["data_spec"] = spec
        model = _call(build, "model.factory", kwargs)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model.factory: {model_config.factory} returned {type(model).__name__}, "
                              "expected a torch.nn.Module.")
        if model_config.gradient_checkpointing and hasattr(model, "gradient_checkpointing"):
            model.gradient_checkpointing = True
        return model
    if model_config.name not in BUILTIN_MODELS:
        raise ConfigError(f"model.name: unknown model {model_config.name!r}. Built-in: "
                          f"{', '.join(sorted(BUILTIN_MODELS))}; or set model.factory.")
    return _call(BUILTIN_MODELS[model_config.name], "model.args", {
        **model_config.args, "data_spec": spec, "gradient_checkpointing": model_config.gradient_checkpointing})


def _call(build: Callable[..., Any], field: str, kwargs: dict[str, Any]) -> Any:
    """Call a builder; a keyword it does not take is the user's typo, reported with what it accepts."""
    signature = inspect.signature(build)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if not takes_any:
        accepted = [n for n, p in signature.parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for key in kwargs:
            if key not in accepted:
                user_keys = [a for a in accepted if a not in ("data_spec", "seed", "gradient_checkpointing")]
                raise ConfigError(f"{field}: {getattr(build, '__name__', build)} takes no argument {key!r}. "
                                  f"It accepts: {', '.join(user_keys) or 'none'}.")
    try:
        return build(**kwargs)
    except ValueError as e:
        raise ConfigError(f"{field}: {e}") from None
