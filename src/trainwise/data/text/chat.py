"""Instruction and chat data: alpaca, sharegpt, OpenAI-style messages and prompt-completion rows, from JSONL,
JSON arrays or Parquet (rows.py), read into one record.

Every row becomes a `Conversation`: a list of turns (`system`, `user`, `assistant`). Which turns carry loss is
data, decided here once: assistant turns do, unless the row says otherwise (an OpenAI message with `"weight": 0`,
the prompt's earlier answers in a prompt-completion row); templates render them, instruct.py turns the flag into
-100 labels. A row that is not one of the formats is named by its source (file:line, file[index]) and skipped,
never a traceback; a file where no row is usable is an error. A key whose value is null counts as absent.

    alpaca             {"instruction", "input" (optional), "output", "system" (optional),
                        "history": [[user, assistant], ...] (optional, the turns before this one)}
    sharegpt           {"conversations": [{"from": "human"|"gpt"|"system", "value": ...} or {"role", "content"}],
                        "system" (optional)}
    messages           {"messages": [{"role": "system"|"user"|"assistant", "content": str or [text parts],
                        "weight": 0|1 (assistant, optional)}]}
    prompt-completion  {"prompt": str, "completion": str}, or {"prompt": [messages], "completion": [messages]}
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal

from trainwise.errors import DataError
from trainwise.data.text.rows import RowError, is_row_file, read_rows

FORMATS = ("alpaca", "sharegpt", "messages", "prompt-completion")
ChatFormat = Literal["auto", "alpaca", "sharegpt", "messages", "prompt-completion"]
ROLES = ("system", "user", "assistant")
MESSAGE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "system": "system"}
TOOL_ROLES = ("tool", "function", "function_call", "observation", "ipython")
MAX_NAMED_PROBLEMS = 10

__all__ = ["FORMATS", "Conversation", "ReadResult", "RowError", "Turn", "conversation_from_row", "detect_format",
           "read_chat_files"]


@dataclass(frozen=True)
class Turn:
    role: Literal["system", "user", "assistant"]
    content: str
    weight: int = 1  # an assistant turn with weight 0 is context only (OpenAI's fine-tuning format)

    @property
    def trains(self) -> bool:
        """What the assistant says carries loss (unless its weight is 0): the prompt and system text are context."""
        return self.role == "assistant" and self.weight != 0


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]
    source: str = ""  # file:line or file[index], for messages about this row

    def as_messages(self) -> list[dict[str, str]]:
        return [{"role": t.role, "content": t.content} for t in self.turns]


@dataclass
class ReadResult:
    conversations: list[Conversation] = field(default_factory=list)
    format: str = ""
    problems: list[str] = field(default_factory=list)  # "source: what is wrong"
    repaired: list[str] = field(default_factory=list)  # rows kept with lone surrogates replaced (data/text/rows.py)

    @property
    def skipped(self) -> int:
        return len(self.problems)

    def problem_summary(self) -> str:
        named = self.problems[:MAX_NAMED_PROBLEMS]
        more = f"\n  ... and {len(self.problems) - len(named)} more" if len(self.problems) > len(named) else ""
        return "\n".join(f"  {p}" for p in named) + more


def detect_format(row: dict) -> str:
    """The format a row is written in, from its keys."""
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "prompt" in row and "completion" in row:
        return "prompt-completion"
    if "instruction" in row or "output" in row:
        return "alpaca"
    raise RowError(f"keys {sorted(row)[:6]} match none of the formats: alpaca needs instruction/output, "
                   "sharegpt needs conversations, messages needs messages, prompt-completion needs prompt and "
                   "completion")


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise RowError(f"{what} must be a string, not {type(value).__name__}")
    return value


def _system(row: dict) -> list[Turn]:
    return [Turn("system", _text(row["system"], "'system'"))] if row.get("system") else []


def _from_alpaca(row: dict) -> list[Turn]:
    if "instruction" not in row or "output" not in row:
        raise RowError("an alpaca row needs both 'instruction' and 'output'")
    prompt = _text(row["instruction"], "'instruction'")
    extra = _text(row.get("input") or "", "'input'")
    turns = _system(row)
    history = row.get("history") or []
    if not isinstance(history, list):
        raise RowError("'history' must be a list of [user, assistant] pairs")
    for i, pair in enumerate(history):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise RowError(f"history[{i}] must be a [user, assistant] pair")
        turns += [Turn("user", _text(pair[0], f"history[{i}][0]")),
                  Turn("assistant", _text(pair[1], f"history[{i}][1]"))]
    turns.append(Turn("user", f"{prompt}\n\n{extra}" if extra else prompt))
    turns.append(Turn("assistant", _text(row["output"], "'output'")))
    return turns


def _from_sharegpt(row: dict) -> list[Turn]:
    items = row.get("conversations")
    if not isinstance(items, list):
        raise RowError("'conversations' must be a list of {from, value}")
    turns = _system(row)
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("from") is None and item.get("role") is not None:
            item = {"from": item["role"], "value": item.get("content")}  # {role, content} items
        if not isinstance(item, dict) or item.get("from") is None or "value" not in item:
            raise RowError(f"conversations[{i}] must be an object with 'from' and 'value'")
        name = _role_name(item["from"], f"conversations[{i}].from").lower()
        role = SHAREGPT_ROLES.get(name)
        if role is None:
            raise RowError(_unsupported_role(f"conversations[{i}]", "from", item["from"], "human, gpt, system"))
        turns.append(Turn(role, _text(item["value"], f"conversations[{i}].value")))
    return turns


def _role_name(value: object, what: str) -> str:
    """A role written as a string (a list or an object there is a malformed row, not a role)."""
    if not isinstance(value, str):
        kind = {list: "list", dict: "object"}.get(type(value), type(value).__name__)
        raise RowError(f"{what} must be a string such as \"user\" or \"assistant\", not a {kind}")
    return value


def _unsupported_role(where: str, key: str, value: object, supported: str) -> str:
    if str(value).lower() in TOOL_ROLES:
        return (f"{where} is a {value!r} turn: tool and function-call turns are not supported; leave such rows "
                "out (or turn the tool's output into user text)")
    return f"{where} has {key}={value!r}; use one of {supported}"


def _content(value: object, what: str) -> str:
    """A message's content: a string, or OpenAI's list of parts, whose text parts are joined by newlines."""
    if not isinstance(value, list):
        return _text(value, what)
    texts = []
    for i, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RowError(f"{what}[{i}] is a {kind!r} part: only text parts are supported (images, audio and "
                           "files are not)")
        texts.append(_text(part.get("text"), f"{what}[{i}].text"))
    return "\n".join(texts)


def _weight(item: dict, role: str, what: str) -> int:
    weight = item.get("weight")
    if weight is None:
        return 1
    if weight not in (0, 1) or isinstance(weight, bool):
        raise RowError(f"{what}.weight must be 0 or 1, not {weight!r}")
    if role != "assistant":
        raise RowError(f"{what}.weight is only for assistant messages (the others never carry loss)")
    return int(weight)


def _messages(items: object, key: str) -> list[Turn]:
    if not isinstance(items, list):
        raise RowError(f"'{key}' must be a list of {{role, content}}")
    turns = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(item, dict) or item.get("role") is None or "content" not in item:
            raise RowError(f"{where} must be an object with 'role' and 'content'")
        role = MESSAGE_ROLES.get(_role_name(item["role"], f"{where}.role"))
        if role is None:
            raise RowError(_unsupported_role(where, "role", item["role"], ", ".join(ROLES)))
        if item.get("tool_calls") or item.get("function_call"):
            raise RowError(f"{where} calls a tool: tool and function-call turns are not supported")
        turns.append(Turn(role, _content(item["content"], f"{where}.content"), _weight(item, role, where)))
    return turns


def _from_messages(row: dict) -> list[Turn]:
    return _messages(row.get("messages"), "messages")


def _from_prompt_completion(row: dict) -> list[Turn]:
    """TRL's prompt-completion rows: only the completion carries loss (answers inside the prompt are context)."""
    prompt, completion = row.get("prompt"), row.get("completion")
    if prompt is None or completion is None:
        raise RowError("a prompt-completion row needs both 'prompt' and 'completion'")
    if isinstance(prompt, str) and isinstance(completion, str):
        return [Turn("user", prompt), Turn("assistant", completion)]
    if not isinstance(prompt, list) or not isinstance(completion, list):
        raise RowError("'prompt' and 'completion' must both be strings or both be lists of {role, content}")
    context = [Turn(t.role, t.content, 0) if t.role == "assistant" else t for t in _messages(prompt, "prompt")]
    answer = _messages(completion, "completion")
    if any(t.role != "assistant" for t in answer):
        raise RowError("'completion' must hold assistant messages only (the prompt holds the rest)")
    return context + answer


READERS = {"alpaca": _from_alpaca, "sharegpt": _from_sharegpt, "messages": _from_messages,
           "prompt-completion": _from_prompt_completion}


def check_turns(turns: list[Turn]) -> None:
    """A conversation the templates can render: system only first, then user and assistant taking turns,
    at least one assistant answer (a row with nothing to learn is a mistake, not a sample)."""
    body = turns[1:] if turns and turns[0].role == "system" else turns
    if any(t.role == "system" for t in body):
        raise RowError("a system turn may only come first")
    if not any(t.role == "assistant" for t in body):
        raise RowError("no assistant turn: nothing to learn from this row")
    if not any(t.trains for t in body):
        raise RowError("every assistant turn has weight 0: nothing to learn from this row")
    if body[0].role != "user":
        raise RowError("the conversation must open with a user turn (after an optional system turn)")
    for before, after in zip(body, body[1:]):
        if before.role == after.role:
            raise RowError(f"two {before.role} turns in a row; user and assistant must take turns")


def conversation_from_row(row: object, fmt: str, source: str = "") -> Conversation:
    if not isinstance(row, dict):
        raise RowError(f"a row must be a JSON object, not {type(row).__name__}")
    row = _without_nulls(row)
    fmt = detect_format(row) if fmt == "auto" else fmt
    if fmt not in READERS:
        raise RowError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    turns = READERS[fmt](row)
    check_turns(turns)
    return Conversation(tuple(turns), source)


def read_chat_files(paths: Iterable[str | Path], fmt: ChatFormat = "auto") -> ReadResult:
    """Read JSONL, JSON or Parquet files of one format (named, or detected from each row's keys)."""
    result = ReadResult()
    formats_seen = set()
    for path in map(Path, paths):
        if not path.is_file():
            raise DataError(f"{path} does not exist. Give JSONL, JSON or Parquet files of alpaca, sharegpt, "
                            "messages or prompt-completion rows.")
        for source, row in read_rows(path, repaired=result.repaired):
            try:
                if isinstance(row, RowError):
                    raise row
                row = _without_nulls(row)
                row_format = detect_format(row) if fmt == "auto" and isinstance(row, dict) else fmt
                result.conversations.append(conversation_from_row(row, row_format, source))
                formats_seen.add(row_format)
            except RowError as e:
                result.problems.append(f"{source}: {e}")
    result.format = "+".join(sorted(formats_seen)) or fmt
    if not result.conversations:
        raise DataError("no usable instruction rows" + (f"; every row has a problem:\n{result.problem_summary()}"
                                                         if result.problems else " (the files are empty)."))
    return result


def _without_nulls(row: object) -> object:
    """A null value is an absent key ("input": null, "system": null; Parquet's columns a row does not use)."""
    return {key: value for key, value in row.items() if value is not None} if isinstance(row, dict) else row


def chat_files(source: Path) -> list[Path]:
    """The row files of an instruction source (a file, or a folder's JSONL, JSON and Parquet files)."""
    if source.is_file():
        return [source]
    return sorted(p for p in source.rglob("*") if p.is_file() and is_row_file(p)
                  and not any(part.startswith(".") for part in p.relative_to(source).parts))
