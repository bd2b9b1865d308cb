"""Issue 32's adversarial pass over the text and chat paths, as one table: each input is generated here, run
through `trainwise prepare` in this process, and judged by its verdict: refused (exit 2, a message naming the
problem, no traceback) or prepared (exit 0, a named warning where something was changed or left out, and the
stored tokens correct). The five data-loss cases are tests/data/test_prepare_nothing_lost.py's."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import invoke
from trainwise.data.text.tokenizer import load_tokenizer
from trainwise.data.text.token_shards import TokenSplit


@dataclass(frozen=True)
class Refused:
    """Exit 2, every phrase in the message, no traceback, no dataset."""
    phrases: tuple[str, ...]


@dataclass(frozen=True)
class Prepared:
    """Exit 0, every phrase in what prepare printed, and `check(out)` holds on the stored data."""
    phrases: tuple[str, ...] = ()
    check: Callable[[Path], None] | None = None


def refused(*phrases: str) -> Refused:
    return Refused(phrases)


def prepared(*phrases: str, check: Callable[[Path], None] | None = None) -> Prepared:
    return Prepared(phrases, check)


# ---- inputs ------------------------------------------------------------------------------------------------

def text_rows(count: int = 12) -> list[str]:
    return [json.dumps({"text": f"document {i}: " + "plain words " * (i + 3)}) for i in range(count)]


def alpaca_rows(count: int = 12) -> list[str]:
    return [json.dumps({"instruction": f"question {i}?", "output": f"answer number {i}."}) for i in range(count)]


def messages_row(user: str = "hi", answer: str = "hello there", role: object = "user") -> str:
    return json.dumps({"messages": [{"role": role, "content": user}, {"role": "assistant", "content": answer}]})


def write(tmp: Path, name: str, lines: list[str] | bytes) -> Path:
    path = tmp / "src" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode("utf-8"))
    return path


def text_source(*extra: str, name: str = "d.jsonl") -> Callable[[Path], list[str]]:
    """Twelve good text rows, then `extra` raw lines (line 13 on)."""
    return lambda tmp: [str(write(tmp, name, text_rows() + list(extra)))]


def chat_source(*extra: str, rows: list[str] | None = None) -> Callable[[Path], list[str]]:
    """Twelve good alpaca rows (or `rows`), then `extra` raw lines, prepared with the chatml template."""
    return lambda tmp: [str(write(tmp, "chat.jsonl", (alpaca_rows() if rows is None else rows) + list(extra))),
                        "--template", "chatml"]


def word_level_tokenizer(directory: Path, vocab: dict[str, int]) -> Path:
    """A transformers tokenizer directory over a word-level vocabulary whose ids need not be dense."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>").save_pretrained(directory)
    return directory


def far_world(tmp: Path) -> list[str]:
    """'world' is id 70,000 in a vocabulary of four: len(tokenizer) says uint16, the ids need uint32."""
    vocab = {"hello": 0, "<|endoftext|>": 1, "[UNK]": 2, "world": 70_000}
    tokenizer = word_level_tokenizer(tmp / "far", vocab)
    source = write(tmp, "d.jsonl", [json.dumps({"text": "hello world hello world"})] * 10)
    return [str(source), "--tokenizer", str(tokenizer)]


def malformed_tokenizer_json(tmp: Path) -> list[str]:
    (tmp / "tok").mkdir()
    (tmp / "tok" / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    return [str(write(tmp, "d.jsonl", text_rows())), "--tokenizer", str(tmp / "tok")]


def export_without_tokenizer(tmp: Path) -> list[str]:
    (tmp / "export").mkdir()
    (tmp / "export" / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 300}))
    return [str(write(tmp, "d.jsonl", text_rows())), "--tokenizer", str(tmp / "export")]


def broken_jinja(tmp: Path) -> list[str]:
    from tests.text.sft_tokenizers import write_hf_tokenizer_dir

    tokenizer = write_hf_tokenizer_dir(tmp / "tok", chat_template="{% for m in messages %}{{ m['content'] }")
    return [str(write(tmp, "chat.jsonl", alpaca_rows())), "--tokenizer", str(tokenizer)]


def changed_tokenizer(tmp: Path) -> list[str]:
    """Prepared once with a tokenizer directory whose contents then change (same path): not "up to date"."""
    from trainwise.data.prepare import PrepareOptions
    from trainwise.data.prepare import prepare_corpus

    source = write(tmp, "d.jsonl", [json.dumps({"text": "hello world"})] * 10)
    word_level_tokenizer(tmp / "tok", {"hello": 0, "world": 1, "<|endoftext|>": 2, "[UNK]": 3})
    prepare_corpus(source, tmp / "out", PrepareOptions(tokenizer=str(tmp / "tok")))
    word_level_tokenizer(tmp / "tok", {"world": 0, "hello": 1, "<|endoftext|>": 2, "[UNK]": 3})
    return [str(source), "--tokenizer", str(tmp / "tok")]


def with_tokenizer(make: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
    """`make`'s source prepared with a transformers tokenizer directory (a BPE) instead of bytes."""
    def made(tmp: Path) -> list[str]:
        from tests.text.sft_tokenizers import write_hf_tokenizer_dir

        return make(tmp) + ["--tokenizer", str(write_hf_tokenizer_dir(tmp / "tok"))]
    return made


def tokenizer_json_not_json(tmp: Path) -> list[str]:
    (tmp / "tok").mkdir()
    (tmp / "tok" / "tokenizer.json").write_text("{ this is not json")
    return [str(write(tmp, "d.jsonl", text_rows())), "--tokenizer", str(tmp / "tok")]


def saved_bpe_damaged(tmp: Path) -> list[str]:
    """A prepared dataset's own tokenizer/ (kind bpe) whose tokenizer.json is valid JSON but not a tokenizer."""
    (tmp / "tok").mkdir()
    (tmp / "tok" / "trainwise_tokenizer.json").write_text(json.dumps({"kind": "bpe"}))
    (tmp / "tok" / "tokenizer.json").write_text(json.dumps({"model": {}}))
    return [str(write(tmp, "d.jsonl", text_rows())), "--tokenizer", str(tmp / "tok")]


def stores_new_ids(out: Path) -> None:
    assert all(doc == [1, 0, 2] for doc in documents(out))


def with_bom(name: str, body: bytes) -> Callable[[Path], list[str]]:
    return lambda tmp: [str(write(tmp, name, b"\xef\xbb\xbf" + body))]


def folder(files: dict[str, list[str]], *options: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        for name, lines in files.items():
            write(tmp, name, lines)
        return [str(tmp / "src"), *options]
    return make


DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000


# ---- checks on the stored data -----------------------------------------------------------------------------

def documents(out: Path, split: str = "train") -> list[list[int]]:
    tokens = TokenSplit(out, split)
    return [tokens.tokens(int(a), int(b)).tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:])]


def decoded(out: Path, split: str = "train") -> list[str]:
    tokenizer = load_tokenizer(out / "tokenizer")
    return [tokenizer.decode([t for t in doc if t != tokenizer.eos_id]) for doc in documents(out, split)]


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def stores_far_ids(out: Path) -> None:
    assert manifest(out)["schema"]["tokens"]["dtype"] == "uint32"
    assert all(doc == [0, 70_000, 0, 70_000, 1] for doc in documents(out))


def no_bom(out: Path) -> None:
    assert not any(text.startswith("\ufeff") or "\ufffd" in text for text in decoded(out))
    assert manifest(out)["skipped"]["count"] == 0


def replaced_surrogate(out: Path) -> None:
    texts = decoded(out) + decoded(out, "val") if manifest(out)["splits"]["val"]["count"] else decoded(out)
    assert any("\ufffd" in text for text in texts) and manifest(out)["skipped"]["count"] == 0


def skipped_one(out: Path) -> None:
    assert manifest(out)["skipped"]["count"] == 1


def empty_answer_dropped(out: Path) -> None:
    stats = manifest(out)["instruct"]["stats"]
    assert sum(s["dropped_no_answer"] for s in stats.values()) == 1
    assert sum(s["samples"] for s in stats.values()) == 12


def blank_answer_has_no_loss(out: Path) -> None:
    """The multi-turn row (the last training sample, source order) trains on its real answer only."""
    train = TokenSplit(out, "train")
    start, end = int(train.offsets[-2]), int(train.offsets[-1])
    tokens, mask = train.tokens(start, end), train.loss_mask(start, end)
    tokenizer = load_tokenizer(out / "tokenizer")
    trained = tokenizer.decode([t for t, m in zip(tokens.tolist(), mask.tolist()) if m and t != tokenizer.eos_id])
    assert trained == "a real answer<|im_end|>\n", trained


def prepared_as_chat(out: Path) -> None:
    assert "instruct" in manifest(out) and manifest(out)["skipped"]["count"] == 1


def prepared_as_text(out: Path) -> None:
    assert "instruct" not in manifest(out) and manifest(out)["skipped"]["count"] == 2


# ---- the table ---------------------------------------------------------------------------------------------
# (id, what the pass found: silent damage | traceback | misleading, the input, the verdict)

CASES = [
    # silent damage
    ("id-above-uint16", "silent damage", far_world, prepared(check=stores_far_ids)),
    ("empty-alpaca-output", "silent damage", chat_source(json.dumps({"instruction": "q?", "output": ""})),
     prepared("1 dropped with an empty answer", "every answer is empty", check=empty_answer_dropped)),
    ("blank-assistant-message", "silent damage", chat_source(messages_row(answer="  ")),
     prepared("1 dropped with an empty answer", check=empty_answer_dropped)),
    ("blank-answer-in-multi-turn-chat", "silent damage", chat_source(json.dumps({"messages": [
        {"role": "user", "content": "first"}, {"role": "assistant", "content": ""},
        {"role": "user", "content": "second"}, {"role": "assistant", "content": "a real answer"}]})),
     prepared("1 blank answer of multi-turn chats kept as context (no loss)", check=blank_answer_has_no_loss)),
    ("bom-txt", "silent damage", with_bom("a.txt", "a document that starts with a byte-order mark".encode()),
     prepared(check=no_bom)),
    ("bom-jsonl", "silent damage", with_bom("d.jsonl", "\n".join(text_rows()).encode()), prepared(check=no_bom)),
    ("bom-json-array", "silent damage",
     with_bom("d.json", json.dumps([json.loads(r) for r in text_rows()]).encode()), prepared(check=no_bom)),
    ("duplicate-across-splits-text", "silent damage", text_source(*text_rows()[:12]),
     prepared("exact duplicates across splits", "are copies of training documents")),
    ("duplicate-across-splits-chat", "silent damage", chat_source(*alpaca_rows()),
     prepared("exact duplicates across splits", "Remove the duplicates")),
    ("non-chat-file-in-chat-folder", "silent damage",
     folder({"chat.jsonl": alpaca_rows(), "notes.txt": ["forgotten notes"], "table.csv": ["a,b"]},
            "--template", "chatml"),
     prepared("ignored 2 files not holding JSONL, JSON or Parquet", "notes.txt", "table.csv")),
    ("chat-file-whose-first-row-is-text", "silent damage",
     chat_source(rows=[json.dumps({"text": "a stray note"})] + alpaca_rows()),
     prepared("mixed formats", "12 chat and 1 plain-text", check=prepared_as_chat)),
    ("text-file-whose-first-rows-are-chat", "silent damage",
     lambda tmp: [str(write(tmp, "d.jsonl", alpaca_rows(2) + text_rows()))],
     prepared("mixed formats", "prepared as plain text", check=prepared_as_text)),
    ("tokenizer-dir-changed", "silent damage", changed_tokenizer, prepared("prepared text into", check=stores_new_ids)),
    # tracebacks
    ("message-role-list", "traceback", chat_source(messages_row(role=["user"])),
     prepared("chat.jsonl:13", "messages[0].role must be a string", "not a list", check=skipped_one)),
    ("message-role-dict", "traceback", chat_source(messages_row(role={"name": "user"})),
     prepared("messages[0].role must be a string", "not a object", check=skipped_one)),
    ("sharegpt-from-list", "traceback",
     chat_source(json.dumps({"conversations": [{"from": ["human"], "value": "hi"}, {"from": "gpt", "value": "yo"}]})),
     prepared("conversations[0].from must be a string", check=skipped_one)),
    ("surrogate-text-jsonl", "traceback", text_source('{"text": "broken \\ud800 pair in scraped text"}'),
     prepared("lone surrogates replaced by U+FFFD", "d.jsonl:13", check=replaced_surrogate)),
    ("surrogate-text-json-array", "traceback",
     lambda tmp: [str(write(tmp, "d.json", ("[" + ",".join(text_rows() + ['{"text": "x \\udfff y"}']) + "]")
                            .encode()))],
     prepared("lone surrogates replaced", "d.json[12]", check=replaced_surrogate)),
    ("surrogate-chat-message", "traceback",
     chat_source(messages_row(user="tell SURROGATE me").replace("SURROGATE", "\\ud83d")),
     prepared("lone surrogates replaced", "chat.jsonl:13")),
    ("surrogate-alpaca-output", "traceback",
     chat_source('{"instruction": "q?", "output": "half \\udc00 pair"}'), prepared("lone surrogates replaced")),
    ("surrogate-with-trained-bpe", "traceback",
     lambda tmp: text_source('{"text": "bad \\ud800 here"}')(tmp) + ["--train-tokenizer", "300"],
     prepared("lone surrogates replaced", check=replaced_surrogate)),
    ("surrogate-pair-kept", "traceback", text_source('{"text": "an escaped emoji \\ud83d\\ude00 is fine"}'),
     prepared(check=lambda out: manifest(out)["notes"] == [] and manifest(out)["skipped"]["count"] == 0)),
    ("deep-nesting-text", "traceback", text_source('{"text": ' + DEEP + "}"),
     prepared("d.jsonl:13", "nested deeper than a JSON reader can follow", check=skipped_one)),
    ("deep-nesting-chat", "traceback", chat_source('{"messages": ' + DEEP + "}"),
     prepared("chat.jsonl:13", "nested deeper", check=skipped_one)),
    ("deep-nesting-json-file", "traceback", lambda tmp: [str(write(tmp, "d.json", DEEP.encode()))],
     refused("no usable document", "nested deeper than a JSON reader can follow")),
    ("huge-int-text", "traceback", text_source('{"text": "fine", "id": ' + HUGE + "}"),
     prepared("d.jsonl:13", "a number too long to read", check=skipped_one)),
    ("huge-int-chat", "traceback", chat_source('{"instruction": "q", "output": "a", "n": ' + HUGE + "}"),
     prepared("chat.jsonl:13", "a number too long to read", check=skipped_one)),
    ("tokenizer-json-malformed", "traceback", malformed_tokenizer_json,
     refused("tokenizer files cannot be read by transformers", "tok", "damaged or not a tokenizer")),
    ("export-dir-without-tokenizer", "misleading", export_without_tokenizer,
     refused("holds a config.json but no tokenizer", "export")),
    ("jinja-syntax-error", "misleading", broken_jinja,
     refused("chat template is not valid Jinja", "the template is broken, not the data", "--template chatml")),
    ("bom-chat-jsonl", "silent damage",
     lambda tmp: with_bom("c.jsonl", "\n".join(alpaca_rows()).encode())(tmp) + ["--template", "chatml"],
     prepared(check=lambda out: manifest(out)["skipped"]["count"] == 0)),
    ("bom-markdown", "silent damage", with_bom("a.md", "# a title after a byte-order mark\n".encode()),
     prepared(check=no_bom)),
    ("empty-completion", "silent damage", chat_source(json.dumps({"prompt": "say it", "completion": ""})),
     prepared("1 dropped with an empty answer", check=empty_answer_dropped)),
    ("blank-sharegpt-answer", "silent damage", chat_source(json.dumps(
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "\n"}]})),
     prepared("1 dropped with an empty answer", check=empty_answer_dropped)),
    ("message-role-number", "traceback", chat_source(messages_row(role=7)),
     prepared("messages[0].role must be a string", "not a int", check=skipped_one)),
    ("surrogate-sharegpt-value", "traceback", chat_source(
        '{"conversations": [{"from": "human", "value": "x \\udbff"}, {"from": "gpt", "value": "ok"}]}'),
     prepared("lone surrogates replaced", "chat.jsonl:13")),
    ("surrogate-with-model-tokenizer", "traceback", with_tokenizer(text_source('{"text": "odd \\udc80 byte"}')),
     prepared("lone surrogates replaced", check=replaced_surrogate)),
    ("surrogate-in-key", "traceback", text_source('{"text": "fine", "\\ud800": 1}'),
     prepared("lone surrogates replaced", check=lambda out: manifest(out)["skipped"]["count"] == 0)),
    ("huge-int-json-file", "traceback", lambda tmp: [str(write(tmp, "d.json", ("[" + HUGE + "]").encode()))],
     refused("no usable document", "a number too long to read")),
    ("tokenizer-json-not-json", "traceback", tokenizer_json_not_json,
     refused("tokenizer files cannot be read by transformers", "tok")),
    ("saved-bpe-tokenizer-damaged", "traceback", saved_bpe_damaged,
     refused("tokenizer.json: not a tokenizer file the `tokenizers` library can read", "prepare the dataset again")),
    # misleading
    ("text-is-object", "misleading", text_source('{"text": {"en": "hello"}}'),
     prepared("the `text` field is an object, not a string", check=skipped_one)),
    ("text-is-number", "misleading", text_source('{"text": 123}'),
     prepared("the `text` field is a number, not a string", check=skipped_one)),
    ("text-is-null", "misleading", text_source('{"text": null}'),
     prepared("the `text` field is null", check=skipped_one)),
    ("text-is-nan", "misleading", text_source('{"text": NaN}'), prepared("the `text` field is NaN", check=skipped_one)),
    ("text-is-list", "misleading", text_source('{"text": ["a", "b"]}'),
     prepared("the `text` field is a list, not a string", check=skipped_one)),
    ("text-is-boolean", "misleading", text_source('{"text": true}'), prepared("is a boolean", check=skipped_one)),
    ("row-is-not-an-object", "misleading", text_source('["text", "in a list"]'),
     prepared("a row must be a JSON object with a `text` field, not a list", check=skipped_one)),
    ("no-text-field", "misleading", text_source('{"body": "elsewhere"}'),
     prepared("no `text` field (has: body); pick the field with --text-field", check=skipped_one)),
    ("empty-val-split-counts-documents", "misleading", lambda tmp: [str(write(tmp, "d.jsonl", text_rows(4)))],
     prepared("0.1 of 4 documents rounds to none")),
    ("empty-val-split-counts-conversations", "misleading", chat_source(rows=alpaca_rows(4)),
     prepared("rounds to none", "conversations")),
    ("one-short-document", "misleading", lambda tmp: [str(write(tmp, "a.txt", b"word"))],
     prepared("the source is one document, cut by position, and it is too short")),
    ("empty-training-split", "misleading", lambda tmp: [str(write(tmp, "a.txt", b" " * 100 + b"words"))],
     refused("the training split holds no tokens", "first part is blank")),
]


@pytest.mark.parametrize("make, verdict", [pytest.param(make, verdict, id=f"{kind}:{name}")
                                           for name, kind, make, verdict in CASES])
def test_adversarial_input(tmp_path, capsys, wide_terminal, make, verdict):
    out = tmp_path / "out"
    result = invoke(capsys, "prepare", *make(tmp_path), "--to", str(out))
    said = " ".join((result.stdout + result.stderr).split())
    assert "Traceback" not in said
    if isinstance(verdict, Refused):
        assert result.returncode == 2, said
        assert not (out / "manifest.json").exists()
    else:
        assert result.returncode == 0, said
    for phrase in verdict.phrases:
        assert phrase in said, f"{phrase!r} not in: {said}"
    if isinstance(verdict, Prepared) and verdict.check is not None:
        verdict.check(out)


def test_the_table_names_each_case_once():
    names = [name for name, *_ in CASES]
    assert len(names) == len(set(names))


# ---- after prepare: the same pass at train, eval, generate and export --------------------------------------

TINY = ["model.args.layers=1", "model.args.width=16", "model.args.heads=2", "train.max_steps=2",
        "train.batch_size=4", "eval.every_steps=2", "schedule.warmup_steps=1", "telemetry.enabled=false",
        "train.sanity=false", "train.device=cpu", "data.num_workers=0"]


def tiny_hf_model(directory: Path, n_positions: int) -> Path:
    """A GPT-2-style model (learned positions, `n_positions` of them) with its own BPE tokenizer."""
    transformers = pytest.importorskip("transformers")
    from tests.text.sft_tokenizers import write_hf_tokenizer_dir

    write_hf_tokenizer_dir(directory)
    vocab = len(transformers.AutoTokenizer.from_pretrained(str(directory)))
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=n_positions, vocab_size=vocab)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    """A finished two-step gpt run on byte-level text, and the data it trained on."""
    from trainwise.launch.runs import train_run
    from trainwise.recipes import load_recipe

    root = tmp_path_factory.mktemp("byte_run")
    source = write(root, "d.jsonl", text_rows(20))
    from trainwise.data.prepare import PrepareOptions
    from trainwise.data.prepare import prepare_corpus

    prepare_corpus(source, root / "data", PrepareOptions())
    config = load_recipe("lm-gpt", [*TINY, "data.seq_len=32", f"data.path={root / 'data'}"])
    return train_run(config, root / "run").path, source, root / "data"


@pytest.mark.slow
def test_data_re_prepared_with_another_tokenizer_is_named_as_such_at_eval(byte_run, capsys, wide_terminal):
    run, source, data = byte_run
    assert invoke(capsys, "prepare", str(source), "--to", str(data), "--train-tokenizer", "300").returncode == 0
    result = invoke(capsys, "eval", str(run))
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2 and "Traceback" not in said, said
    assert "was re-prepared with another tokenizer since this run trained" in said
    assert "config.yaml edited" not in said


@pytest.mark.slow
def test_merge_on_a_run_without_an_adapter_says_so(byte_run, tmp_path, capsys):
    result = invoke(capsys, "export", str(byte_run[0]), "--merge", "--to", str(tmp_path / "hf"))
    assert result.returncode == 2 and "has no adapter to merge" in " ".join(result.stderr.split())
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_seq_len_above_the_models_context_is_refused_before_step_1(tmp_path, capsys, wide_terminal):
    model = tiny_hf_model(tmp_path / "model", n_positions=32)
    source = write(tmp_path, "d.jsonl", text_rows(20))
    assert invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "data"),
                  "--tokenizer", str(model)).returncode == 0
    result = invoke(capsys, "train", "lm-gpt", *TINY, f"model.hf={model}", f"data.path={tmp_path / 'data'}",
                    "data.seq_len=64", "--out", str(tmp_path / "run"))
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in said, said
    assert "data.seq_len 64 is above the model's context of 32 positions" in said
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_seq_len_below_the_prepared_samples_warns_with_the_count_cut(tmp_path, capsys, wide_terminal):
    rows = [json.dumps({"instruction": f"question {i} " + "with a long prompt " * 4, "output": f"answer {i}"})
            for i in range(24)]
    source = write(tmp_path, "chat.jsonl", rows)
    assert invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "data"), "--template", "chatml",
                  "--seq-len", "512").returncode == 0
    result = invoke(capsys, "train", "lm-gpt", *TINY, f"data.path={tmp_path / 'data'}", "data.seq_len=32",
                    "--out", str(tmp_path / "run"), show_warnings=True)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, said
    assert "data.seq_len 32 is below the length the instruction data was prepared for (512)" in said
    train = TokenSplit(tmp_path / "data", "train")
    longer = int((np.diff(train.offsets) > 32).sum())
    assert longer and f"{longer} of {train.documents} training samples are longer and will be cut" in said


def test_generate_past_a_gpt2_position_table_caps_the_new_tokens(tmp_path):
    import torch
    import transformers

    from trainwise.errors import TrainwiseWarning
    from trainwise.text.generate import Sampling, generate_ids

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=50)
    model = transformers.GPT2LMHeadModel(config)
    with pytest.warns(TrainwiseWarning, match="generation stops after 4 new tokens"):
        out = generate_ids(model, list(range(12)), Sampling(max_tokens=40, temperature=0), eos_id=None,
                           device=torch.device("cpu"))
    assert len(out) == 4
    with pytest.warns(TrainwiseWarning) as caught:
        out = generate_ids(model, list(range(30)), Sampling(max_tokens=5, temperature=0), eos_id=None,
                           device=torch.device("cpu"))
    said = [str(w.message) for w in caught]
    assert len(out) == 1 and any("its first 15 tokens are left out" in line for line in said)


@pytest.mark.slow
def test_a_model_directory_without_a_tokenizer_is_said_to_be_unchecked(tmp_path, capsys, wide_terminal):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=300)
    transformers.GPT2LMHeadModel(config).save_pretrained(str(tmp_path / "weights"))
    source = write(tmp_path, "d.jsonl", text_rows(20))
    assert invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "data")).returncode == 0
    result = invoke(capsys, "train", "lm-gpt", *TINY, f"model.hf={tmp_path / 'weights'}",
                    f"data.path={tmp_path / 'data'}", "data.seq_len=32", "--out", str(tmp_path / "run"),
                    show_warnings=True)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 0, said
    assert "holds no tokenizer, so trainwise cannot check that the data's ids (tokenizer: bytes)" in said
