"""Instruction and chat data: alpaca, sharegpt and OpenAI-style messages JSONL, read into one record.

Every row becomes a `Conversation`: a list of turns (`system`, `user`, `assistant`). Which turns carry loss is
data, decided here once: only assistant turns do (templates.py renders them, masks.py turns the flag into -100
labels). A row that is not one of the formats is named by file:line and skipped, never a traceback; a file where
no row is usable is an error.

    alpaca    {"instruction": ..., "input": ... (optional), "output": ..., "system": ... (optional)}
    sharegpt  {"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...], "system": ... (optional)}
    messages  {"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Literal

from trainwise.errors import DataError

FORMATS = ("alpaca", "sharegpt", "messages")
ChatFormat = Literal["auto", "alpaca", "sharegpt", "messages"]
ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "system": "system"}
MAX_NAMED_PROBLEMS = 10


@dataclass(frozen=True)
class Turn:
    role: Literal["system", "user", "assistant"]
    content: str

    @property
    def trains(self) -> bool:
        """Only what the assistant says carries loss: the prompt and the system text are context."""
        return self.role == "assistant"


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]
    source: str = ""  # file:line, for messages about this row

    def as_messages(self) -> list[dict[str, str]]:
        return [{"role": t.role, "content": t.content} for t in self.turns]


@dataclass
class ReadResult:
    conversations: list[Conversation] = field(default_factory=list)
    format: str = ""
    problems: list[str] = field(default_factory=list)  # "file:line: what is wrong"

    @property
    def skipped(self) -> int:
        return len(self.problems)

    def problem_summary(self) -> str:
        named = self.problems[:MAX_NAMED_PROBLEMS]
        more = f"\n  ... and {len(self.problems) - len(named)} more" if len(self.problems) > len(named) else ""
        return "\n".join(f"  {p}" for p in named) + more


class RowError(ValueError):
    """One row is not in the format: the message says what is wrong with it."""


def detect_format(row: dict) -> str:
    """The format a row is written in, from its keys."""
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row or "output" in row:
        return "alpaca"
    raise RowError(f"keys {sorted(row)[:6]} match none of the formats: alpaca needs instruction/output, "
                   "sharegpt needs conversations, messages needs messages")


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise RowError(f"{what} must be a string, not {type(value).__name__}")
    return value


def _from_alpaca(row: dict) -> list[Turn]:
    if "instruction" not in row or "output" not in row:
        raise RowError("an alpaca row needs both 'instruction' and 'output'")
    prompt = _text(row["instruction"], "'instruction'")
    extra = _text(row.get("input") or "", "'input'")
    turns = [Turn("system", _text(row["system"], "'system'"))] if row.get("system") else []
    turns.append(Turn("user", f"{prompt}\n\n{extra}" if extra else prompt))
    turns.append(Turn("assistant", _text(row["output"], "'output'")))
    return turns


def _from_sharegpt(row: dict) -> list[Turn]:
    items = row.get("conversations")
    if not isinstance(items, list):
        raise RowError("'conversations' must be a list of {from, value}")
    turns = [Turn("system", _text(row["system"], "'system'"))] if row.get("system") else []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "from" not in item or "value" not in item:
            raise RowError(f"conversations[{i}] must be an object with 'from' and 'value'")
        role = SHAREGPT_ROLES.get(str(item["from"]).lower())
        if role is None:
            raise RowError(f"conversations[{i}] has from={item['from']!r}; use one of human, gpt, system")
        turns.append(Turn(role, _text(item["value"], f"conversations[{i}].value")))
    return turns


def _from_messages(row: dict) -> list[Turn]:
    items = row.get("messages")
    if not isinstance(items, list):
        raise RowError("'messages' must be a list of {role, content}")
    turns = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "role" not in item or "content" not in item:
            raise RowError(f"messages[{i}] must be an object with 'role' and 'content'")
        if item["role"] not in ROLES:
            raise RowError(f"messages[{i}] has role={item['role']!r}; use one of {', '.join(ROLES)}")
        turns.append(Turn(item["role"], _text(item["content"], f"messages[{i}].content")))
    return turns


READERS = {"alpaca": _from_alpaca, "sharegpt": _from_sharegpt, "messages": _from_messages}


def check_turns(turns: list[Turn]) -> None:
    """A conversation the templates can render: system only first, then user and assistant taking turns,
    at least one assistant answer (a row with nothing to learn is a mistake, not a sample)."""
    body = turns[1:] if turns and turns[0].role == "system" else turns
    if any(t.role == "system" for t in body):
        raise RowError("a system turn may only come first")
    if not any(t.role == "assistant" for t in body):
        raise RowError("no assistant turn: nothing to learn from this row")
    if body[0].role != "user":
        raise RowError("the conversation must open with a user turn (after an optional system turn)")
    for before, after in zip(body, body[1:]):
        if before.role == after.role:
            raise RowError(f"two {before.role} turns in a row; user and assistant must take turns")


def conversation_from_row(row: object, fmt: str, source: str = "") -> Conversation:
    if not isinstance(row, dict):
        raise RowError(f"a row must be a JSON object, not {type(row).__name__}")
    fmt = detect_format(row) if fmt == "auto" else fmt
    if fmt not in READERS:
        raise RowError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    turns = READERS[fmt](row)
    check_turns(turns)
    return Conversation(tuple(turns), source)


def _rows(path: Path) -> Iterator[tuple[int, object | RowError]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield number, RowError(f"not UTF-8 ({e.reason} at byte {e.start})")
            except json.JSONDecodeError as e:
                yield number, RowError(f"not valid JSON ({e.msg}, column {e.colno})")


def read_chat_files(paths: Iterable[str | Path], fmt: ChatFormat = "auto") -> ReadResult:
    """Read JSONL files of one format (named, or detected from the first usable row of each file)."""
    result = ReadResult()
    formats_seen = set()
    for path in map(Path, paths):
        if not path.is_file():
            raise DataError(f"{path} does not exist. Give JSONL files of alpaca, sharegpt or messages rows.")
        file_format = fmt
        for number, row in _rows(path):
            source = f"{path}:{number}"
            try:
                if isinstance(row, RowError):
                    raise row
                if file_format == "auto" and isinstance(row, dict):
                    file_format = detect_format(row)
                result.conversations.append(conversation_from_row(row, file_format, source))
            except RowError as e:
                result.problems.append(f"{source}: {e}")
        if file_format != "auto":
            formats_seen.add(file_format)
    result.format = "+".join(sorted(formats_seen)) or fmt
    if not result.conversations:
        raise DataError("no usable instruction rows" + (f"; every row has a problem:\n{result.problem_summary()}"
                                                         if result.problems else " (the files are empty)."))
    return result
