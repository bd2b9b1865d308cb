"""Instruction data as people have it: JSON arrays (alpaca_data.json), wrapped arrays, JSONL under a .json name,
Parquet; and the row variants in the wild (alpaca history, sharegpt {role, content}, OpenAI content parts and
weight 0, TRL prompt-completion), each read into the exact conversation, bad rows named by their source."""
from __future__ import annotations

import json

import pytest

from trainwise.errors import DataError
from trainwise.data.text.chat import Conversation, Turn, read_chat_files
from trainwise.data.text.chat_prepare import looks_like_chat

ALPACA = [{"instruction": "Reverse the words", "input": "a b c", "output": "c b a"},
          {"instruction": "Say hi", "input": "", "output": "hi"}]
EXPECTED = [(Turn("user", "Reverse the words\n\na b c"), Turn("assistant", "c b a")),
            (Turn("user", "Say hi"), Turn("assistant", "hi"))]


def turns(result):
    return [c.turns for c in result.conversations]


def test_a_pretty_printed_json_array_is_read_with_sources_by_index(tmp_path):
    path = tmp_path / "alpaca_data.json"
    path.write_text(json.dumps(ALPACA, indent=4))
    result = read_chat_files([path])
    assert result.format == "alpaca" and turns(result) == EXPECTED and not result.problems
    assert [c.source for c in result.conversations] == [f"{path}[0]", f"{path}[1]"]
    assert looks_like_chat(path)


@pytest.mark.parametrize("key", ["data", "train"])
def test_an_object_holding_one_list_of_rows_is_unwrapped(tmp_path, key):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"version": "1.0", key: ALPACA}))
    assert turns(read_chat_files([path])) == EXPECTED


def test_jsonl_under_a_json_name_is_read_line_by_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ALPACA[0]) + "\n{broken\n" + json.dumps(ALPACA[1]) + "\n")
    result = read_chat_files([path])
    assert turns(result) == EXPECTED
    assert [p.split(": ", 1)[0] for p in result.problems] == [f"{path}:2"]


def test_a_broken_json_array_is_named_with_its_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[\n  {"instruction": "a", "output": "b"},\n  {"instruction": \n]')
    with pytest.raises(DataError, match=r"d.json: not valid JSON \(.* at line 4"):
        read_chat_files([path])


def test_parquet_messages_with_nested_columns_come_out_as_dicts(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"messages": [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]},
            {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
                          {"role": "assistant", "content": "a", "weight": 0}, {"role": "user", "content": "r"},
                          {"role": "assistant", "content": "b"}]}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)  # unused struct fields come back as null "weight"
    result = read_chat_files([path])
    assert result.format == "messages" and [c.source for c in result.conversations] == [f"{path}[0]", f"{path}[1]"]
    assert turns(result) == [(Turn("user", "2+2"), Turn("assistant", "4")),
                             (Turn("system", "S"), Turn("user", "q"), Turn("assistant", "a", 0),
                              Turn("user", "r"), Turn("assistant", "b"))]
    assert looks_like_chat(path) and looks_like_chat(tmp_path)


def test_alpaca_history_and_system_become_earlier_turns_and_nulls_are_absent(tmp_path):
    row = {"instruction": "and now?", "input": None, "output": "done", "system": "Be brief.",
           "history": [["first", "one"], ["second", "two"]]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps([row, {**row, "system": None, "history": None}]))
    assert turns(read_chat_files([path])) == [
        (Turn("system", "Be brief."), Turn("user", "first"), Turn("assistant", "one"), Turn("user", "second"),
         Turn("assistant", "two"), Turn("user", "and now?"), Turn("assistant", "done")),
        (Turn("user", "and now?"), Turn("assistant", "done"))]


def test_sharegpt_items_with_role_and_content(tmp_path):
    row = {"conversations": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "hello"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n")
    result = read_chat_files([path])
    assert result.format == "sharegpt"
    assert turns(result) == [(Turn("system", "S"), Turn("user", "hi"), Turn("assistant", "hello"))]


def test_openai_content_parts_are_joined_and_weight_zero_is_kept(tmp_path):
    row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "line one"},
                                                     {"type": "text", "text": "line two"}]},
                        {"role": "assistant", "content": "old", "weight": 0},
                        {"role": "user", "content": "again"},
                        {"role": "assistant", "content": [{"type": "text", "text": "new"}], "weight": 1}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n")
    conversation = read_chat_files([path]).conversations[0]
    assert conversation.turns == (Turn("user", "line one\nline two"), Turn("assistant", "old", 0),
                                  Turn("user", "again"), Turn("assistant", "new", 1))
    assert [t.trains for t in conversation.turns] == [False, False, False, True]


def test_prompt_completion_rows_plain_and_conversational(tmp_path):
    plain = {"prompt": "The sky is", "completion": " blue."}
    chat = {"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                       {"role": "user", "content": "colour of the sky?"}],
            "completion": [{"role": "assistant", "content": "blue"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(plain) + "\n" + json.dumps(chat) + "\n")
    result = read_chat_files([path])
    assert result.format == "prompt-completion" and not result.problems
    assert turns(result) == [(Turn("user", "The sky is"), Turn("assistant", " blue.")),
                             (Turn("user", "hi"), Turn("assistant", "hello", 0), Turn("user", "colour of the sky?"),
                              Turn("assistant", "blue"))]
    assert read_chat_files([path], fmt="prompt-completion").conversations == result.conversations


def test_unsupported_turns_and_malformed_rows_are_named_by_source(tmp_path):
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "{}"},
                           {"from": "observation", "value": "r"}, {"from": "gpt", "value": "a"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                      {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"},
                      {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 2}]},
        {"instruction": "q", "output": "a", "history": [["only one"]]},
        {"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]},
        "a string",
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps([good, *bad, good], indent=2))
    result = read_chat_files([path])
    assert len(result.conversations) == 2
    assert [p.split(": ", 1)[0] for p in result.problems] == [f"{path}[{i}]" for i in range(1, 9)]
    reasons = [p.split(": ", 1)[1] for p in result.problems]
    for reason, words in zip(reasons, ["'function_call' turn: tool and function-call turns are not supported",
                                       "'image_url' part: only text parts are supported",
                                       "'tool' turn", "every assistant turn has weight 0", "weight must be 0 or 1",
                                       "history[0] must be a [user, assistant] pair", "both be strings or both",
                                       "must be a JSON object"]):
        assert words in reason, (reason, words)


def test_conversations_built_in_code_default_to_weight_one():
    conversation = Conversation((Turn("user", "q"), Turn("assistant", "a")))
    assert conversation.turns[1].weight == 1 and conversation.turns[1].trains
