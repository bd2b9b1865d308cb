"""The small things of issue 35's first hour: help that shows `trainwise[llm]`, --version, whole recipe
descriptions, a warmup fitted to a shortened run, a resume given overrides, greedy `generate` by default."""
from __future__ import annotations

import pytest

from tests.conftest import assert_refused, invoke
from trainwise.errors import ConfigWarning
from trainwise.recipes import list_recipes, load_recipe
from trainwise.text.generate import Sampling


def test_version_and_the_help_that_rich_no_longer_eats(capsys, wide_terminal):
    from trainwise import __version__

    result = invoke(capsys, "--version")
    assert result.returncode == 0 and result.stdout.strip() == f"trainwise {__version__}"
    help_text = invoke(capsys, "train", "--help").stdout
    assert "pip install 'trainwise[llm]'" in help_text and "'trainwise'`" not in help_text


def test_recipe_descriptions_are_whole_sentences():
    described = list_recipes()
    assert described["lm-gpt"].endswith("byte-level: nothing to download.")
    assert all(text.endswith(".") for text in described.values()), described


def test_a_shortened_run_keeps_the_recipes_share_of_warmup_and_says_so():
    with pytest.warns(ConfigWarning, match=r"warmup_steps 100 → 2.*5% of the run.*train\.max_steps=50"):
        config = load_recipe("lm-gpt", ["train.max_steps=50"])
    assert config.schedule.warmup_steps == 2 and config.train.max_steps == 50


def test_a_warmup_the_user_set_is_still_checked_as_given(capsys):
    assert_refused(invoke(capsys, "train", "lm-gpt", "train.max_steps=50", "schedule.warmup_steps=80", "--out",
                          "never"), "warmup_steps (80) must be smaller than train.max_steps (50)")


def test_resume_with_overrides_says_where_settings_change(tmp_path, capsys):
    result = invoke(capsys, "resume", str(tmp_path / "run"), "train.max_steps=600")
    assert_refused(result, "resume takes no KEY=VALUE overrides", "`max_steps: 600` under `train:`",
                   "--allow-config-change")


def test_generate_is_greedy_unless_asked_to_sample():
    assert Sampling().temperature == 0.0


def test_prepares_next_step_names_the_model_whose_tokenizer_made_the_data(tmp_path):
    from trainwise.cli.data import next_step

    model = tmp_path / "models" / "smol"
    model.mkdir(parents=True)
    chats = {"kind": "text", "instruct": {"template": "chatml"}}
    assert f"sft-lora model.hf={model} data.path=" in next_step(chats, tmp_path / "ds", str(model))
    assert "model.hf=MODEL_DIR" in next_step(chats, tmp_path / "ds", "bytes")
    assert f"lm-gpt model.hf={model} data.path=" in next_step({"kind": "text"}, tmp_path / "ds", str(model))
