"""`trainwise prepare` on the files people have: a pretty-printed alpaca JSON array through the CLI, a Parquet
messages file, text rows in JSON and Parquet; a Parquet table still goes to tables; weight-0 answers are -100."""
from __future__ import annotations

import json

import pytest

from tests.conftest import invoke
from tests.text.sft_tokenizers import CORPUS
from trainwise.data.prepare import PrepareOptions
from trainwise.data.text.chat import Conversation, Turn
from trainwise.data.text.chat_templates import BUILTIN_TEMPLATES
from trainwise.data.text.corpus import looks_like_text, read_documents
from trainwise.data.text.instruct import encode_conversation
from trainwise.data.prepare import prepare_corpus
from trainwise.data.text.tokenizer import BpeTokenizer
from trainwise.data.text.token_shards import TokenSplit


@pytest.fixture(scope="module")
def bpe():
    return BpeTokenizer.train(CORPUS, 300)


def trained_runs(sample, tokenizer):
    runs, current = [], []
    for token, trains in zip(sample.ids + [None], sample.trains + [False]):
        if trains:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode([t for t in current if t != tokenizer.eos_id])), current.clear()
    return runs


@pytest.mark.parametrize("template", ["chatml", "plain"])
def test_weight_zero_answers_carry_no_loss_and_the_others_do(bpe, template):
    chat = Conversation((Turn("user", "reverse: one two"), Turn("assistant", "two one", 0),
                         Turn("user", "sort 3 1 2"), Turn("assistant", "1 2 3")))
    weighted = encode_conversation(chat, BUILTIN_TEMPLATES[template], bpe)
    runs = trained_runs(weighted, bpe)
    assert len(runs) == 1 and runs[0].startswith("1 2 3")
    plain = encode_conversation(Conversation(tuple(Turn(t.role, t.content) for t in chat.turns)),
                                BUILTIN_TEMPLATES[template], bpe)
    assert weighted.ids == plain.ids  # the same tokens: only the loss differs
    assert [r.split("<")[0].strip() for r in trained_runs(plain, bpe)] == ["two one", "1 2 3"]


def test_weight_zero_with_the_tokenizers_own_jinja_template(tmp_path):
    from tests.text.sft_tokenizers import write_hf_tokenizer_dir
    from trainwise.data.text.chat_templates import choose_template
    from trainwise.data.text.tokenizer import ModelTokenizer

    pytest.importorskip("transformers")
    tokenizer = ModelTokenizer.from_directory(write_hf_tokenizer_dir(tmp_path / "model"))
    chat = Conversation((Turn("user", "q"), Turn("assistant", "old", 0), Turn("user", "r"), Turn("assistant", "new")))
    sample = encode_conversation(chat, choose_template(None, tokenizer), tokenizer)
    runs = trained_runs(sample, tokenizer)
    assert len(runs) == 1 and runs[0].startswith("new") and "old" not in runs[0]


def test_held_out_conversations_keep_their_weights(tmp_path, bpe):
    from trainwise.data.text.chat import ReadResult
    from trainwise.data.text.chat_prepare import InstructOptions, prepare_instructions, read_held_out

    chats = [Conversation((Turn("user", f"q{i}"), Turn("assistant", "old", 0), Turn("user", "r"),
                           Turn("assistant", f"a{i}")), f"f[{i}]") for i in range(4)]
    prepare_instructions(ReadResult(chats, "messages"), tmp_path / "ds", bpe,
                         InstructOptions(template="chatml", val_fraction=0.5))
    held = read_held_out(tmp_path / "ds", "val")
    assert len(held) == 2 and held[0].turns[1] == Turn("assistant", "old", 0) and held[0].turns[3].weight == 1


def alpaca_rows(n):
    return [{"instruction": f"Reverse: w{i} w{i + 1}", "input": "", "output": f"w{i + 1} w{i}"} for i in range(n)]


def test_the_prepare_command_reads_a_pretty_printed_alpaca_json_array(tmp_path, capsys):
    source = tmp_path / "alpaca_data.json"
    source.write_text(json.dumps(alpaca_rows(6) + [{"instruction": "no output"}], indent=4))
    done = invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "ds"), "--template", "chatml",
                  "--train-tokenizer", "300", "--val-fraction", "0", "--test-fraction", "0")
    assert done.returncode == 0, done.stderr
    assert "instruction data (alpaca), chat template chatml: 6 training samples" in done.stdout
    assert f"{source}[6]" in done.stdout and "needs both 'instruction' and 'output'" in done.stdout
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["kind"] == "text" and manifest["instruct"]["format"] == "alpaca"
    assert TokenSplit(tmp_path / "ds", "train").documents == 6


def test_a_parquet_messages_file_is_prepared_as_instruction_data(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"messages": [{"role": "user", "content": f"copy w{i}"}, {"role": "assistant", "content": f"w{i}"}]}
            for i in range(8)]
    source = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    assert looks_like_text(source)
    done = invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "ds"), "--template", "chatml",
                  "--train-tokenizer", "300", "--val-fraction", "0.25", "--test-fraction", "0")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["instruct"]["format"] == "messages"
    assert manifest["instruct"]["stats"]["train"]["samples"] == 6 and manifest["skipped"]["count"] == 0


def test_text_rows_in_json_and_parquet_are_documents(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps({"rows": [{"text": "first doc"}, {"body": "x"}, {"text": "second"}]}))
    pq.write_table(pa.Table.from_pylist([{"text": "third", "id": 1}, {"text": None, "id": 2}]), folder / "b.parquet")
    documents = list(read_documents(folder))
    assert [(d.name, d.text) for d in documents if d.text] == [("a.json[0]", "first doc"), ("a.json[2]", "second"),
                                                               ("b.parquet[0]", "third")]
    assert [d.name for d in documents if not d.text] == ["a.json[1]", "b.parquet[1]"]
    assert looks_like_text(folder / "b.parquet") and looks_like_text(folder)
    result = prepare_corpus(folder, tmp_path / "out", PrepareOptions(val_fraction=0.0, test_fraction=0.0))
    assert result.manifest["kind"] == "text" and "instruct" not in result.manifest
    assert TokenSplit(tmp_path / "out", "train").documents == 3


def test_a_parquet_table_with_ordinary_columns_still_goes_to_tables(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "churn.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "a note", "age": 30, "label": "yes"}] * 4), path)
    assert not looks_like_text(path)
    pq.write_table(pa.Table.from_pylist([{"age": 30, "plan": "basic", "churned": 1}] * 4), path)
    assert not looks_like_text(path)
