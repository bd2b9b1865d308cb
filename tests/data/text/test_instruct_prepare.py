"""The instruction `prepare`: conversations -> token shards whose loss mask is the assistant's tokens, packed
samples whose labels are -100 on every prompt token, held-out conversations kept for evaluation."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.text.sft_tokenizers import CHATML_JINJA, CORPUS, write_hf_tokenizer_dir
from trainwise.data.shards import verify
from trainwise.data.prepare import PrepareOptions
from trainwise.data.prepare import prepare_corpus as prepare
from trainwise.data.text.chat import read_chat_files
from trainwise.data.text.chat_prepare import InstructOptions, prepare_instructions, read_held_out
from trainwise.data.text.packing import IGNORE_INDEX, PackedTextDataset
from trainwise.data.text.tokenizer import BpeTokenizer, ModelTokenizer, load_tokenizer
from trainwise.data.text.token_shards import TokenSplit


def rows(n):
    out = []
    for i in range(n):
        words = " ".join(f"w{(i * 7 + k) % 13}" for k in range(3))
        if i % 3 == 0:
            out.append({"instruction": "reverse", "input": words, "output": " ".join(reversed(words.split()))})
        elif i % 3 == 1:
            out.append({"conversations": [{"from": "human", "value": f"copy {words}"}, {"from": "gpt", "value": words}]})
        else:
            out.append({"messages": [{"role": "system", "content": "short"}, {"role": "user", "content": f"copy {words}"},
                                     {"role": "assistant", "content": words}, {"role": "user", "content": "again"},
                                     {"role": "assistant", "content": words}]})
    return out


def write_files(tmp_path, n=30):
    tmp_path.mkdir(exist_ok=True)
    paths = {}
    for fmt, index in (("alpaca", 0), ("sharegpt", 1), ("messages", 2)):
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows(n)[index::3]))
        paths[fmt] = path
    return paths


@pytest.fixture(scope="module")
def bpe():
    return BpeTokenizer.train(CORPUS, 300)


def test_prepare_writes_masked_shards_that_pack_with_minus_100_on_prompts(tmp_path, bpe):
    write_files(tmp_path / "chats")
    out = tmp_path / "ds"
    result = prepare(tmp_path / "chats", out, PrepareOptions(template="chatml", seq_len=64, val_fraction=0.2,
                                                             test_fraction=0.0, train_tokenizer=300))
    manifest = result.manifest
    assert verify(out) == [] and manifest["kind"] == "text" and manifest["instruct"]["template"] == {"name": "chatml"}
    assert manifest["instruct"]["format"] == "alpaca+messages+sharegpt"
    bpe = load_tokenizer(out / "tokenizer")
    stream = TokenSplit(out, "train")
    assert stream.has_loss_mask and stream.documents == manifest["instruct"]["stats"]["train"]["samples"] == 24
    batch = PackedTextDataset(stream, 64, pad_id=bpe.eos_id, split_documents=False).__getitems__([0, 1])
    for ids, labels, positions in zip(batch["input_ids"], batch["labels"], batch["position_ids"]):
        trained = [int(label) for label in labels if label != IGNORE_INDEX]
        assert trained and len(trained) < len(labels) // 2
        text = bpe.decode(trained)
        assert "<|im_start|>" not in text and "copy" not in text and "reverse" not in text
    held = read_held_out(out, "val")
    assert len(held) == 6 and held[0].turns[-1].role == "assistant"


def test_prompt_masking_off_makes_every_token_a_target(tmp_path, bpe):
    paths = write_files(tmp_path, 9)
    out = tmp_path / "ds"
    result = prepare_instructions(read_chat_files([paths["alpaca"]]), out, bpe,
                                  InstructOptions(template="plain", mask_prompt=False, val_fraction=0.0))
    stream = TokenSplit(out, "train", {**result.fields, "kind": "text"})
    assert stream.loss_mask(0, stream.total).all()


def test_the_model_directorys_chat_template_is_used_and_recorded(tmp_path):
    tokenizer = ModelTokenizer.from_directory(write_hf_tokenizer_dir(tmp_path / "model"))
    paths = write_files(tmp_path, 9)
    out = tmp_path / "ds"
    result = prepare_instructions(read_chat_files([paths["messages"]]), out, tokenizer, InstructOptions(val_fraction=0.0))
    assert result.fields["instruct"]["template"]["name"] == "tokenizer"
    stream = TokenSplit(out, "train", {**result.fields, "kind": "text"})
    ids = stream.tokens(0, int(stream.offsets[1])).astype(np.int64)
    mask = stream.loss_mask(0, int(stream.offsets[1])).astype(bool)
    assert tokenizer.decode(ids[mask].tolist()).count("<|im_end|>") == 2  # both answers, each with its end


def test_the_prepare_command_prints_the_loss_share_and_the_length_histogram(tmp_path, capsys):
    from tests.conftest import invoke

    paths = write_files(tmp_path, 12)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(paths["messages"].read_text() + '{"messages": [{"role": "user", "content": "q"}]}\n')
    done = invoke(capsys, "prepare", str(bad), "--to", str(tmp_path / "ds"), "--template", "chatml",
                  "--train-tokenizer", "300", "--val-fraction", "0")
    assert done.returncode == 0, done.stderr
    assert "tokens carrying loss (assistant answers):" in done.stdout and "document length" in done.stdout
    assert "Next: trainwise train sft-lora" in done.stdout
    assert f"{bad}:5" in done.stdout and "no assistant turn" in done.stdout
    refused = invoke(capsys, "prepare", str(bad), "--to", str(tmp_path / "ds2"), "--train-tokenizer", "300")
    assert refused.returncode == 2 and "--template NAME" in refused.stderr


def test_a_conversation_the_models_template_refuses_is_named_and_skipped(tmp_path):
    """Gemma's template raises on a system turn: that row is skipped and listed, the others are prepared."""
    no_system = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                 + CHATML_JINJA)
    tokenizer = ModelTokenizer.from_directory(write_hf_tokenizer_dir(tmp_path / "model", no_system))
    paths = write_files(tmp_path, 9)  # the messages rows open with a system turn; the sharegpt rows do not
    read = read_chat_files([paths["sharegpt"], paths["messages"]])
    result = prepare_instructions(read, tmp_path / "ds", tokenizer, InstructOptions(val_fraction=0.0))
    assert result.stats["train"].samples == 3 and read.skipped == 3
    assert all(f"{paths['messages']}:" in p and "System role not supported" in p for p in read.problems)
    assert result.fields["skipped"]["count"] == 3
