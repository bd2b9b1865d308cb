"""Built-in recipes: YAML files beside this module, each opening with the command that runs it."""
from __future__ import annotations

import difflib
import re
import warnings
from pathlib import Path

from trainwise.config import RunConfig, load_config
from trainwise.errors import ConfigError, ConfigWarning
from trainwise.recipes.schemas import check_builders

RECIPE_DIR = Path(__file__).parent


def list_recipes() -> dict[str, str]:
    """Recipe name → its description: the first sentence of the file's opening comment, whole even where it
    runs over several comment lines."""
    recipes = {}
    for path in sorted(RECIPE_DIR.glob("*.yaml")):
        opening = []
        for line in path.read_text().splitlines():
            text = line.lstrip("#").strip()
            if not line.startswith("#") or not text:
                break
            opening.append(text)
        recipes[path.stem] = re.split(r"(?<=\.)\s", " ".join(opening), maxsplit=1)[0]
    return recipes


def resolve_recipe(name_or_path: str) -> Path:
    """A YAML file path, or the name of a built-in recipe."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():
        if not candidate.is_file():
            raise ConfigError(f"{candidate}: no such recipe file.")
        return candidate
    name = name_or_path.replace("_", "-")
    path = RECIPE_DIR / f"{name}.yaml"
    if path.is_file():
        return path
    names = list(list_recipes())
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown recipe {name_or_path!r}.{hint} Built-in recipes: {', '.join(names)}; "
                      "or give the path to a YAML file.")


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> RunConfig:
    """The recipe with overrides applied, validated, including the built-in model's and data's arguments."""
    path = resolve_recipe(name_or_path)
    config = load_config(path, overrides)
    drop_other_models_args(config, load_config(path).model.name, overrides or [])
    check_builders(config, source=str(path), overrides=overrides or [])
    warn_from_scratch_settings(config)
    return config


# lm-gpt's settings train from scratch; on a pretrained model they undo what it learned (issue 35: test
# perplexity 20.9 -> 22.0 in 100 steps at lr 1e-3 and decay 0.1; 14.0 at 5e-5 without decay).
FROM_SCRATCH_LR = 5e-4
FROM_SCRATCH_DECAY = 0.1


def warn_from_scratch_settings(config: RunConfig) -> None:
    """A pretrained model.hf under a from-scratch recipe's learning rate or weight decay: say so, name lm-continue."""
    optim = config.optim
    if config.name != "lm-gpt" or not config.model.hf or not (
            optim.lr >= FROM_SCRATCH_LR or optim.weight_decay >= FROM_SCRATCH_DECAY):
        return
    warnings.warn(f"lm-gpt trains from scratch (optim.lr={optim.lr:g}, optim.weight_decay={optim.weight_decay:g}); "
                  f"on the pretrained model.hf={config.model.hf} these settings undo what it learned. For continued "
                  f"pretraining use `trainwise train lm-continue model.hf={config.model.hf} data.path=DIR` (lr 5e-5, "
                  "no weight decay), or set optim.lr=5e-5 optim.weight_decay=0.", ConfigWarning, stacklevel=2)


def drop_other_models_args(config: RunConfig, recipe_model: str | None, overrides: list[str]) -> None:
    """`trainwise train shop-sasrec model.name=popularity`: the recipe's `model.args` were written for its own
    model (hidden, heads, ...). When an override switches to another built-in model, the recipe's arguments
    that model does not take are dropped (those it shares, like `hidden` for gru4rec, are kept); arguments
    set on the command line are kept, and checked against the new model."""
    from trainwise.recipes.schemas import MODEL_ARGS

    schema = MODEL_ARGS.get(config.model.name or "")
    if schema is None or config.model.factory or config.model.name == recipe_model or "model.args" in {
            item.split("=", 1)[0] for item in overrides}:  # the whole mapping given: the user's to check
        return
    given = {item.split("=", 1)[0].removeprefix("model.args.") for item in overrides
             if item.startswith("model.args.")}
    config.model.args = {key: value for key, value in config.model.args.items()
                         if key in schema.model_fields or key in given}


# A run trained from Python on the user's own module and dataset records them as `python:<class path>`
# (train/loop/python_run.py): the CLI can read such a run, but cannot build its model or data again.
FROM_PYTHON = "python:"


def refuse_python_run(config: RunConfig) -> None:
    """ConfigError for a config recorded by a run made from Python: nothing here can rebuild its parts."""
    if str(config.model.name or "").startswith(FROM_PYTHON) or str(config.data.name or "").startswith(FROM_PYTHON):
        raise ConfigError(
            f"this run was trained from Python on your own model ({config.model.name.removeprefix(FROM_PYTHON)}) "
            f"and data ({str(config.data.name).removeprefix(FROM_PYTHON)}): the CLI cannot build them again, so "
            "`trainwise eval`, `resume` and `check` cannot run on it. `trainwise diagnose`, `report` and "
            "`compare` read it as it is. Evaluate it from Python: load RUN/model.safetensors into your model "
            "(safetensors.torch.load_file) and call trainwise.train.predict(model, dataset, device=...); resume "
            "with Trainer(model, data, config=..., run_dir=RunDir.open(RUN)).fit(resume=True).")
