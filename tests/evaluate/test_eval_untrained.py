"""Scoring the untrained model (issue 35): `trainwise eval MODEL --data DIR` measures a model no run trained on a
prepared dataset's held-out split (perplexity for text, exact match for chat), so "before" needs no run."""
from __future__ import annotations

import json
import math

import pytest

from tests.conftest import invoke
from tests.text.sft_data import reverse_chats
from tests.text.sft_tokenizers import CORPUS, write_hf_tokenizer_dir

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random-init Llama saved as a plain Hugging Face folder, with a tokenizer trained here."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory = write_hf_tokenizer_dir(tmp_path_factory.mktemp("model"))
    vocab = len(AutoTokenizer.from_pretrained(str(directory)))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    LlamaForCausalLM(config).save_pretrained(str(directory))
    return directory


def _prepared(capsys, tmp_path, name: str, rows: list[dict], *options: str):
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = invoke(capsys, "prepare", str(source), "--to", str(tmp_path / name), *options)
    assert done.returncode == 0, done.stderr
    return tmp_path / name


def test_a_model_dir_is_scored_on_prepared_chats_with_every_answer(model_dir, tmp_path, capsys):
    data = _prepared(capsys, tmp_path, "chats", reverse_chats(20), "--tokenizer", str(model_dir),
                     "--test-fraction", "0.2", "--seq-len", "48")
    done = invoke(capsys, "eval", str(model_dir), "--data", str(data), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["checkpoint"] == "untrained" and result["split"] == "test" and result["task"] == "causal_lm"
    assert result["tokens"] > 0 and math.isclose(result["perplexity"], math.exp(result["loss"]), rel_tol=1e-6)
    scored = result["instruct"]
    assert scored["answers"] == scored["held_out"] == 4 and len(scored["all_answers"]) == 4
    assert scored["exact_match"] == sum(row["correct"] for row in scored["all_answers"]) / 4
    assert {"prompt", "reference", "answer", "correct"} <= set(scored["all_answers"][0])
    assert [g["prompt"] for g in result["generations"]] == [r["prompt"] for r in scored["all_answers"]]
    assert not (model_dir / "eval").exists()  # nothing is written beside the model
    table = invoke(capsys, "eval", str(model_dir), "--data", str(data))
    assert table.returncode == 0, table.stderr
    assert "(untrained)" in table.stdout and "held-out prompts" in table.stdout and "answer tokens" in table.stdout


def test_a_model_dir_on_text_gets_the_perplexity_of_an_untrained_model(model_dir, tmp_path, capsys):
    data = _prepared(capsys, tmp_path, "text", [{"text": line} for line in CORPUS[:40]], "--tokenizer",
                     str(model_dir), "--seq-len", "32")
    done = invoke(capsys, "eval", str(model_dir), "--data", str(data), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    assert "instruct" not in result and result["tokens"] > 0
    assert vocab / 2 < result["perplexity"] < vocab * 2  # random weights: about a uniform guess


def test_eval_model_refusals_say_what_to_do(model_dir, tmp_path, capsys):
    other = _prepared(capsys, tmp_path, "bytes", [{"text": line} for line in CORPUS[:40]])
    mismatch = invoke(capsys, "eval", str(model_dir), "--data", str(other))
    assert mismatch.returncode == 2 and "another tokenizer" in mismatch.stderr and "Traceback" not in mismatch.stderr
    no_data = invoke(capsys, "eval", str(model_dir))
    assert no_data.returncode == 2 and "--data DIR" in no_data.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: x\n")
    with_run = invoke(capsys, "eval", str(run), "--data", str(other))
    assert with_run.returncode == 2 and "--before" in with_run.stderr
