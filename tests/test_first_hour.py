"""Small things a first hour trips over (issue 26): the README's set-up, field docs vs overrides, help texts
at 80-120 columns."""
from __future__ import annotations

import functools
import re
import types
import typing

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from tests.conftest import ROOT
from trainwise.config import RunConfig, config_from_dict
from trainwise.errors import ConfigError


# ---- README ----------------------------------------------------------------------------------------------

def test_readme_says_where_the_command_lives_and_what_make_test_installs():
    readme = (ROOT / "README.md").read_text()
    assert "." + "venv/bin/" in readme and "command not found" in readme  # the README says where the CLI is
    assert re.search(r"make test.*chromium.*apt-get.*root|make test.*root.*apt-get.*chromium", readme, re.S)


# ---- field docs vs overrides -------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["None", "null"])
def test_no_clipping_is_accepted_as_the_docs_spell_it(spelling):
    config = config_from_dict({"train": {"max_steps": 10}}, overrides=[f"train.grad_clip_norm={spelling}"])
    assert config.train.grad_clip_norm is None


def _fields(model: type[BaseModel] = RunConfig, prefix: str = ""):
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _fields(info.annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info


def _literal_values(annotation) -> list:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        return [value for arg in typing.get_args(annotation) for value in _literal_values(arg)]
    return []


def test_every_choice_field_lists_its_values():
    missing = {key: [v for v in _literal_values(info.annotation)
                     if not re.search(rf"(?<![\w.]){re.escape(str(v))}(?![\w])", info.description or "")]
               for key, info in _fields()}
    assert not {key: values for key, values in missing.items() if values}


def test_model_name_lists_every_built_in_model():
    from trainwise.recipes.models import BUILTIN_MODELS

    description = RunConfig.model_fields["model"].annotation.model_fields["name"].description
    assert all(f"`{name}`" in description for name in BUILTIN_MODELS)


def test_a_misspelt_key_is_suggested_with_its_section():
    with pytest.raises(ConfigError, match=r"Did you mean 'optim\.lr'\?"):
        config_from_dict({"train": {"max_steps": 10}}, overrides=["optim.lrr=0.1"])


# ---- help texts ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _help(*args: str, columns: int) -> str:
    from trainwise.cli.app import app

    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns), "TERMINAL_WIDTH": ""})
    assert result.exit_code == 0, result.output
    return result.output


def _commands() -> list[tuple[str, ...]]:
    from trainwise.cli.app import app

    names = [(info.name or info.callback.__name__.replace("_", "-"),) for info in app.registered_commands]
    for group in app.registered_groups:
        names += [(group.name, info.name or info.callback.__name__) for info in group.typer_instance.registered_commands]
    return names


def test_train_help_at_80_columns_cuts_nothing():
    text = _help("train", columns=80)
    assert "…" not in text
    assert "train.strategy=auto" in text and "--rdzv-endpoint" in text


def test_argument_placeholders_are_spelt_one_way():
    for command in _commands():
        usage = next(line for line in _help(*command, columns=300).splitlines() if "Usage:" in line)
        arguments = usage.split("[OPTIONS]", 1)[1].split()
        for argument in arguments:   # RECIPE, [KEY=VALUE]..., RUN, [LOGFILE|-]: upper case, no braces
            assert re.fullmatch(r"\[?[A-Z][A-Z_=|\-]*\]?(\.\.\.)?", argument), (command, usage)


def test_help_texts_do_not_break_mid_sentence():
    """At 300 columns every paragraph of a command's docstring that fits is on one line: the docstrings'
    own line breaks are not kept."""
    from trainwise.cli.app import app, unwrap_help

    overview = [line.strip(" │") for line in _help(columns=300).splitlines()]
    for info in app.registered_commands:
        first = unwrap_help(info.callback.__doc__).split("\n\n")[0]
        if len(first) < 200:   # the commands panel's description column holds 200 characters at 300 columns
            assert any(first in line for line in overview), first
    for command in _commands():
        lines = [line.strip(" │") for line in _help(*command, columns=300).splitlines()]
        info = next(i for i in app.registered_commands if (i.name or i.callback.__name__.replace("_", "-"))
                    == command[0]) if len(command) == 1 else None
        if info is None:
            continue
        for paragraph in unwrap_help(info.callback.__doc__).split("\n\n"):
            if len(paragraph) < 250:
                assert any(paragraph in line for line in lines), (command, paragraph)
