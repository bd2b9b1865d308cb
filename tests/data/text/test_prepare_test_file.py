"""`prepare --test-file F` (issue 35): a held-out file is the test split instead of (or on top of) a random
share, read and checked as the training source is (bad rows named by file:line), its edits noticed."""
from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import invoke
from tests.text.sft_data import reverse_chats
from trainwise.data.shards import read_manifest
from trainwise.data.text.chat_prepare import read_held_out
from trainwise.data.text.token_shards import TokenSplit


def _rows(path, rows, bad: str = "") -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + bad)
    return str(path)


def test_chats_of_the_test_file_are_the_test_split_and_its_bad_rows_are_named(tmp_path, capsys):
    source = _rows(tmp_path / "train.jsonl", reverse_chats(20))
    held_rows = reverse_chats(5, seed=1)
    held = _rows(tmp_path / "held.jsonl", held_rows, bad='{"instruction": "no output"}\n')
    done = invoke(capsys, "prepare", source, "--to", str(tmp_path / "data"), "--test-file", held,
                  "--template", "chatml")
    assert done.returncode == 0, done.stderr
    manifest = read_manifest(tmp_path / "data")
    test = read_held_out(tmp_path / "data", "test")
    assert [c.as_messages() for c in test] == [row["messages"] for row in held_rows]  # all of it, none of the source
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == 20
    assert [(Path(e["file"]).name, e["reason"]) for e in manifest["skipped"]["files"]] \
        == [("held.jsonl:6", "an alpaca row needs both 'instruction' and 'output'")]
    assert "test split: the 5 conversations of --test-file" in done.stdout

    # on top of a random share, when --test-fraction is given too; an edit of the file prepares again
    _rows(tmp_path / "held.jsonl", held_rows[:3])
    again = invoke(capsys, "prepare", source, "--to", str(tmp_path / "data"), "--test-file", held,
                   "--template", "chatml", "--test-fraction", "0.1")
    assert again.returncode == 0 and "up to date" not in again.stdout, again.stderr
    assert len(read_held_out(tmp_path / "data", "test")) == 3 + 2


def test_text_documents_of_the_test_file_are_the_test_split(tmp_path, capsys):
    source = _rows(tmp_path / "train.jsonl", [{"text": f"document {i}: " + "words " * 20} for i in range(10)])
    held = _rows(tmp_path / "held.jsonl", [{"text": "held out one"}, {"text": "held out two"}], bad="{oops\n")
    done = invoke(capsys, "prepare", source, "--to", str(tmp_path / "data"), "--test-file", held)
    assert done.returncode == 0, done.stderr
    test = TokenSplit(tmp_path / "data", "test")
    assert test.documents == 2 and bytes(test.tokens(0, 12).tolist()) == b"held out one"
    skipped = read_manifest(tmp_path / "data")["skipped"]["files"]
    assert [Path(entry["file"]).name for entry in skipped] == ["held.jsonl:3"] and "not valid JSON" in skipped[0]["reason"]
    assert "test split: the 2 documents of --test-file" in done.stdout


def test_a_test_file_that_cannot_serve_is_refused_with_the_reason(tmp_path, capsys):
    source = _rows(tmp_path / "train.jsonl", reverse_chats(10))
    bad = _rows(tmp_path / "bad.jsonl", [{"instruction": "no output"}])
    refused = invoke(capsys, "prepare", source, "--to", str(tmp_path / "a"), "--test-file", bad)
    assert refused.returncode == 2 and "--test-file" in refused.stderr and "bad.jsonl:1" in refused.stderr
    missing = invoke(capsys, "prepare", source, "--to", str(tmp_path / "b"), "--test-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    (tmp_path / "folder").mkdir()
    inside = _rows(tmp_path / "folder" / "held.jsonl", reverse_chats(2))
    _rows(tmp_path / "folder" / "train.jsonl", reverse_chats(10))
    within = invoke(capsys, "prepare", str(tmp_path / "folder"), "--to", str(tmp_path / "c"), "--test-file", inside)
    assert within.returncode == 2 and "would train too" in within.stderr
    table = tmp_path / "table.csv"
    table.write_text("x,label\n" + "".join(f"{i},{i % 2}\n" for i in range(20)))
    other_kind = invoke(capsys, "prepare", str(table), "--to", str(tmp_path / "d"), "--test-file", bad)
    assert other_kind.returncode == 2 and "text and instruction data" in other_kind.stderr
    assert "--test-file" in invoke(capsys, "prepare", "--help").stdout
