"""Continued pretraining (issue 35): lm-continue on a pretrained model lowers test perplexity on a text that
ships with Python, with the recipe's own settings; lm-gpt given a pretrained model.hf with from-scratch settings
warns and names lm-continue."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import invoke
from trainwise.errors import ConfigWarning
from trainwise.recipes import load_recipe


def test_lm_gpt_on_a_pretrained_model_warns_and_names_lm_continue(tmp_path):
    with pytest.warns(ConfigWarning, match=r"optim.lr=0.001.*lm-continue model.hf="):
        load_recipe("lm-gpt", [f"model.hf={tmp_path}"])
    with pytest.warns(ConfigWarning, match="weight_decay=0.1"):
        load_recipe("lm-gpt", [f"model.hf={tmp_path}", "optim.lr=5e-5"])


def test_lm_continue_and_gentle_lm_gpt_settings_do_not_warn(tmp_path, recwarn):
    config = load_recipe("lm-continue", [f"model.hf={tmp_path}"])
    load_recipe("lm-gpt", [f"model.hf={tmp_path}", "optim.lr=5e-5", "optim.weight_decay=0"])
    load_recipe("lm-gpt", ["model.hf_config=gpt2"])  # random initialisation: from-scratch settings fit
    assert not [w for w in recwarn if issubclass(w.category, ConfigWarning)]
    assert (config.optim.lr, config.optim.weight_decay, config.model.method) == (5e-5, 0.0, "full")


def _test_perplexity(capsys, run: Path) -> tuple[float, int]:
    result = invoke(capsys, "eval", str(run))
    assert result.returncode == 0, result.stderr
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["split"] == "test"
    return metrics["perplexity"], metrics["tokens"]


@pytest.mark.slow
def test_continued_pretraining_lowers_test_perplexity(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    # A text that ships with Python: textwrap's source, one document per paragraph
    paragraphs = [part for part in Path(textwrap.__file__).read_text().split("\n\n") if part.strip()]
    with (tmp_path / "corpus.jsonl").open("w") as out:
        out.writelines(json.dumps({"text": part}) + "\n" for part in paragraphs)
    prepared = invoke(capsys, "prepare", str(tmp_path / "corpus.jsonl"), "--to", str(tmp_path / "data"),
                      "--train-tokenizer", "400")
    assert prepared.returncode == 0, prepared.stderr
    # "Pretrained": a tiny Llama trained briefly from random initialisation, exported as a Hugging Face directory
    config = transformers.LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    config.to_json_file(str(tmp_path / "tiny.json"))
    data = [f"data.path={tmp_path / 'data'}", "data.seq_len=64"]
    pretrain = invoke(capsys, "train", "lm-gpt", f"model.hf_config={tmp_path / 'tiny.json'}", *data,
                      "train.max_steps=60", "train.batch_size=8", "eval.every_steps=60", "--out",
                      str(tmp_path / "pretrain"))
    assert pretrain.returncode == 0, pretrain.stderr
    assert invoke(capsys, "export", str(tmp_path / "pretrain"), "--to", str(tmp_path / "base")).returncode == 0
    before = _test_perplexity(capsys, tmp_path / "pretrain")

    # The user's way: the corpus prepared with the model's own tokenizer (the export carries it)
    again = invoke(capsys, "prepare", str(tmp_path / "corpus.jsonl"), "--to", str(tmp_path / "data-base"),
                   "--tokenizer", str(tmp_path / "base"))
    assert again.returncode == 0, again.stderr
    more = invoke(capsys, "train", "lm-continue", f"model.hf={tmp_path / 'base'}",
                  f"data.path={tmp_path / 'data-base'}", "data.seq_len=64", "train.epochs=3",
                  "--out", str(tmp_path / "more"), show_warnings=True)
    assert more.returncode == 0, more.stderr
    assert "this run trains only" in more.stderr and "3 epochs of" in more.stderr  # said before step 1
    resolved = (tmp_path / "more" / "config.yaml").read_text()
    assert "lr: 5.0e-05" in resolved and "weight_decay: 0.0" in resolved
    after = _test_perplexity(capsys, tmp_path / "more")
    assert after[1] == before[1]  # the same test tokens: the two tokenizers agree
    assert after[0] < before[0], (before, after)
