"""Instruction data: the three formats read into one record, detected or named, bad rows named by file:line."""
from __future__ import annotations

import json

import pytest

from trainwise.errors import DataError
from trainwise.data.text.chat import Turn, read_chat_files


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ALPACA = {"instruction": "Reverse the words", "input": "a b c", "output": "c b a"}
SHAREGPT = {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "hi"},
                              {"from": "gpt", "value": "hello"}, {"from": "human", "value": "bye"},
                              {"from": "gpt", "value": "ciao"}]}
MESSAGES = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2"},
                         {"role": "assistant", "content": "4"}]}


@pytest.mark.parametrize("row,fmt,turns", [
    (ALPACA, "alpaca", [Turn("user", "Reverse the words\n\na b c"), Turn("assistant", "c b a")]),
    (SHAREGPT, "sharegpt", [Turn("system", "Be brief."), Turn("user", "hi"), Turn("assistant", "hello"),
                            Turn("user", "bye"), Turn("assistant", "ciao")]),
    (MESSAGES, "messages", [Turn("system", "S"), Turn("user", "2+2"), Turn("assistant", "4")]),
])
def test_each_format_is_detected_and_read(tmp_path, row, fmt, turns):
    result = read_chat_files([write_jsonl(tmp_path / "d.jsonl", [row, row])])
    assert result.format == fmt and len(result.conversations) == 2 and not result.problems
    assert list(result.conversations[0].turns) == turns
    named = read_chat_files([tmp_path / "d.jsonl"], fmt=fmt)
    assert named.conversations == result.conversations


def test_malformed_rows_are_named_by_file_and_line_and_skipped(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        MESSAGES, "{not json", {"messages": [{"role": "user", "content": "q"}]},
        {"messages": [{"role": "robot", "content": "x"}]}, {"messages": [{"role": "user", "content": 3},
                                                                         {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                      {"role": "assistant", "content": "c"}]}, MESSAGES])
    result = read_chat_files([path])
    assert len(result.conversations) == 2
    assert [p.split(": ", 1)[0] for p in result.problems] == [f"{path}:{n}" for n in (2, 3, 4, 5, 6)]
    text = "\n".join(result.problems)
    for words in ("not valid JSON", "no assistant turn", "role='robot'", "must be a string", "two user turns"):
        assert words in text


def test_a_named_format_that_does_not_fit_says_why(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ALPACA])
    with pytest.raises(DataError, match=r"d.jsonl:1: .*conversations"):
        read_chat_files([path], fmt="sharegpt")


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_chat_files([tmp_path / "nope.jsonl"])
