"""Reading a run's config: a YAML recipe, `key=value` overrides from the command line, validation into a
RunConfig (schema.py) with messages.py's errors, and the YAML written to RUN/config.yaml."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainwise.config.messages import check_key_path, format_validation_error
from trainwise.config.schema import RunConfig
from trainwise.errors import ConfigError, ConfigWarning


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML recipe, apply `key=value` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of sections (model:, data:, train:, ...), "
                          f"not a {type(raw).__name__}.")
    return config_from_dict(raw, source=str(path), overrides=overrides)


def config_from_dict(raw: dict[str, Any], *, source: str = "config",
                     overrides: list[str] | None = None) -> RunConfig:
    raw = _deep_copy(raw)
    recipe = _deep_copy(raw)
    for item in overrides or []:
        apply_override(raw, item)
    _fit_warmup(recipe, raw, overrides or [])
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, overrides or [])) from None


def _fit_warmup(recipe: dict[str, Any], raw: dict[str, Any], overrides: list[str]) -> None:
    """A run shortened by `train.max_steps=N` below the recipe's warmup keeps the recipe's warmup share of
    the run (100 of 2,000 steps: 5%, so 2 of 50), said as a ConfigWarning; a warmup the overrides set
    themselves is the user's and is checked as given (RunConfig refuses one that does not fit)."""
    keys = {item.partition("=")[0].strip() for item in overrides}
    schedule, train = raw.get("schedule") or {}, raw.get("train") or {}
    if "train.max_steps" not in keys or keys & {"schedule.warmup_steps", "schedule.warmup_fraction", "schedule"}:
        return
    steps, warmup = train.get("max_steps"), schedule.get("warmup_steps")
    if schedule.get("warmup_fraction") is not None or not all(isinstance(n, int) and n > 0 for n in (steps, warmup)):
        return
    planned = (recipe.get("train") or {}).get("max_steps")
    if warmup < steps or not (isinstance(planned, int) and planned > warmup):  # fits, or never fitted the recipe
        return
    share = warmup / planned
    fitted = min(steps - 1, max(1, round(share * steps))) if steps > 1 else 0
    schedule["warmup_steps"] = fitted
    warnings.warn(f"schedule.warmup_steps {warmup} → {fitted}: the recipe's warmup ({share:.0%} of the run) fitted "
                  f"to train.max_steps={steps}; set schedule.warmup_steps=N to choose it.", ConfigWarning,
                  stacklevel=4)


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Set `a.b.c=value` in a raw config mapping; the value is read as YAML (numbers, lists, null)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: write it as key=value, for example optim.lr=3e-4.")
    key, _, text = item.partition("=")
    parts = key.strip().split(".")
    check_key_path(parts, item)
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = parse_value(text)


def parse_value(text: str) -> Any:
    if text.strip() == "None":  # how the field docs and Python spell YAML's null
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def dump_yaml(config: RunConfig) -> str:
    data = config.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False)


def _deep_copy(raw: Any) -> Any:
    if isinstance(raw, dict):
        return {k: _deep_copy(v) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_deep_copy(v) for v in raw]
    return raw

