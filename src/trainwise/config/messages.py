"""What a config error says: the key, the value, where it came from (the recipe file or an override on the
command line), the field's own description, and the keys that were meant; and the field reference
`trainwise train --help` prints."""
from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from trainwise.config.schema import RunConfig
from trainwise.errors import ConfigError


def field_description(dotted: str) -> str | None:
    """The description of a field such as `optim.lr`, for help and error messages."""
    model: type[BaseModel] = RunConfig
    info = None
    for part in dotted.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = info.annotation  # type: ignore[assignment]
    return info.description if info else None


def format_validation_error(error: ValidationError, source: str, overrides: list[str] = ()) -> str:
    """One line per problem. A problem in a key set on the command line names that override and its value,
    not the recipe file, which the user may never have opened."""
    given = _given(overrides)
    lines, from_recipe = [], False
    for item in error.errors():
        loc = [str(p) for p in item["loc"]]
        where = ".".join(loc) or "(top level)"
        override = _blamed(loc, item["msg"], given)
        from_recipe |= override is None
        origin = f" (given by the override {override!r})" if override else ""
        if item["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key{origin}.{_suggestion(loc)}")
            continue
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "literal_error":
            message = f"{message} (got {item.get('input')!r})"
        description = field_description(".".join(p for p in loc if not p.isdigit()))
        hint = f"\n    ({description})" if description else ""
        lines.append(f"  {where}: {message}{origin}{hint}")
    return "\n".join([problems_header(source, from_recipe), *lines])


def problems_header(source: str, from_recipe: bool) -> str:
    """Blame the recipe only when one of the problems came from it, not from the command line."""
    return f"{source}: invalid configuration" if from_recipe else f"invalid override on the command line " \
           f"(recipe {source})"


def name_overrides(problems: list[str], source: str, overrides: list[str] = ()) -> str:
    """`key: message` lines as one message: a key set on the command line names that override."""
    given = _given(overrides)
    lines, from_recipe = [], False
    for line in problems:
        key, _, message = line.partition(": ")
        override = _blamed(key.split("."), message, given)
        from_recipe |= override is None
        lines.append(f"  {key}: {message}" + (f" (given by the override {override!r})" if override else ""))
    return "\n".join([problems_header(source, from_recipe), *lines])


def _given(overrides: list[str]) -> dict[str, str]:
    """{dotted key: the override as typed} of the command line's `key=value` items."""
    return {item.partition("=")[0].strip(): item for item in overrides if "=" in item}


def _blamed(loc: list[str], message: str, given: dict[str, str]) -> str | None:
    """The override behind a problem at `loc`: the one that set it or a section above it; an unknown
    argument below it that the message names (`din takes no argument 'hiden'`); or a key a cross-field
    problem names (`warmup_steps (20) must be smaller than train.max_steps (20)`). None: the recipe's."""
    key = ".".join(loc)
    return (_override_of(loc, given)
            or next((item for name, item in given.items() if key and name.startswith(f"{key}.")
                     and repr(name[len(key) + 1:].split(".")[0]) in message), None)
            or next((item for name, item in given.items() if name in message), None))


def _override_of(loc: list[str], given: dict[str, str]) -> str | None:
    """The command-line override that set this location (or a section above it), if one did."""
    for depth in range(len(loc), 0, -1):
        override = given.get(".".join(loc[:depth]))
        if override is not None:
            return override
    return None


def check_key_path(parts: list[str], item: str) -> None:
    model: Any = RunConfig
    for depth, part in enumerate(parts):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return  # inside a free mapping such as model.args
        if part not in model.model_fields:
            raise ConfigError(f"override {item!r}: unknown key {'.'.join(parts[:depth + 1])!r}."
                              f"{_suggestion(parts[:depth + 1])}")
        annotation = model.model_fields[part].annotation
        model = annotation


def _suggestion(loc: list[str]) -> str:
    model: Any = RunConfig
    for part in loc[:-1]:
        if isinstance(model, type) and issubclass(model, BaseModel) and part in model.model_fields:
            model = model.model_fields[part].annotation
        else:
            return ""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    names = list(model.model_fields)
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.5)
    prefix = ".".join(loc[:-1])
    where = f" in {prefix}" if prefix else ""
    if close:
        return f" Did you mean {close[0]!r}? Allowed{where}: {', '.join(names)}."
    return f" Allowed{where}: {', '.join(names)}."


def field_reference(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Every overridable field as (dotted key, default, description), for `trainwise train --help`."""
    rows: list[tuple[str, Any, str]] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += field_reference(annotation, f"{prefix}{name}.")
        else:
            default = None if info.is_required() else info.get_default(call_default_factory=True)
            rows.append((f"{prefix}{name}", default, info.description or ""))
    return rows
