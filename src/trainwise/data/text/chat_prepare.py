"""`trainwise prepare` for instruction data: conversations (JSONL, JSON, Parquet) -> token shards with a loss mask.

The dataset is an ordinary text dataset (data/text/token_shards.py: tokens, document offsets, the tokenizer) whose
`loss_mask` marks the assistant's tokens, so packing (data/text/packing.py) gives -100 to every prompt token and keeps
samples apart. The manifest's `instruct` entry says how it was made (format, chat template, prompt masking, the
counts of truncated and dropped samples), so training, `generate` and evaluation render prompts the same way.
Held-out conversations are also kept as JSONL (`val/conversations.jsonl`, `test/...`): evaluation asks the model
to answer their prompts and compares with the reference answers.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.rundir.atomic import atomic_write_bytes
from trainwise.errors import DataError
from trainwise.data.text.chat import Conversation, ReadResult, Turn, chat_files, read_chat_files
from trainwise.data.text.corpus import SplitCopies, repair_notes
from trainwise.data.text.chat_templates import BUILTIN_TEMPLATES, choose_template, save_template_choice, template_record
from trainwise.data.text.instruct import EncodeStats, TooLong, encode_all
from trainwise.data.text.packing import length_report
from trainwise.data.text.rows import chat_keys, is_row_file, read_rows
from trainwise.data.text.token_shards import TOKENIZER_DIR, TokenSplitWriter, text_schema, token_dtype


@dataclass(frozen=True)
class InstructOptions:
    format: str = "auto"          # auto | alpaca | sharegpt | messages | prompt-completion
    template: str | None = None   # a built-in name, or None: the tokenizer's own chat template
    seq_len: int = 2048           # the longest sample kept (tokens)
    too_long: TooLong = "truncate"
    mask_prompt: bool = True      # False: every token carries loss (an ablation, reported as such)
    val_fraction: float = 0.1
    test_fraction: float = 0.0
    seed: int = 0

    @classmethod
    def from_prepare(cls, options: Any) -> "InstructOptions":
        """From `trainwise prepare`'s options (data/prepare.py's PrepareOptions)."""
        return cls(format=options.chat_format, template=options.template, seq_len=options.seq_len or 2048,
                   too_long=options.too_long, mask_prompt=options.mask_prompt, val_fraction=options.val_fraction,
                   test_fraction=options.test_fraction, seed=options.seed)


@dataclass
class InstructResult:
    fields: dict[str, Any]  # the manifest's fields (data/prepare.py adds kind, source and options)
    read: ReadResult
    stats: dict[str, EncodeStats]


@dataclass(frozen=True)
class FormatSample:
    """What the first rows of a source are: chat rows (alpaca, sharegpt, messages, prompt-completion) and rows
    with a text field, counted over up to FORMAT_SAMPLE rows (one odd first row decides nothing)."""

    chat: int = 0
    text: int = 0
    rows: int = 0

    @property
    def is_chat(self) -> bool:
        return self.chat > 0 and self.chat >= self.text

    @property
    def note(self) -> str | None:
        """The mixed-format warning, when both kinds of rows are there."""
        if not (self.chat and self.text):
            return None
        chosen, other = ("chat", "plain-text") if self.is_chat else ("plain text", "chat")
        return (f"mixed formats: of the first {self.rows} rows, {self.chat} chat and {self.text} plain-text; "
                f"prepared as {chosen}, so the {other} rows are skipped (each named in manifest.json). Put each "
                "kind in its own file and prepare them apart.")


FORMAT_SAMPLE = 200


def format_sample(source: Path, text_field: str = "text") -> FormatSample:
    """Chat rows and text rows among the first FORMAT_SAMPLE rows of the source's row files."""
    chat = text = rows = 0
    for path in chat_files(source) if source.exists() else []:
        for _, row in read_rows(path) if is_row_file(path) else ():
            keys = {key for key, value in row.items() if value is not None} if isinstance(row, dict) else set()
            is_chat = chat_keys(keys)
            chat, text, rows = chat + is_chat, text + (not is_chat and text_field in keys), rows + 1
            if rows >= FORMAT_SAMPLE:
                return FormatSample(chat, text, rows)
    return FormatSample(chat, text, rows)


def looks_like_chat(source: Path) -> bool:
    """Row files (JSONL, JSON, Parquet) whose first rows are mostly alpaca, sharegpt, messages or
    prompt-completion (so `prepare` needs no --kind)."""
    return format_sample(source).is_chat


def ignored_files(source: Path) -> list[str]:
    """Files of a chat folder that are not row files (JSONL, JSON, Parquet): not read, and said so."""
    if not source.is_dir():
        return []
    return sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file() and not is_row_file(p)
                  and not any(part.startswith(".") for part in p.relative_to(source).parts))


def conversations_file(split: str) -> str:
    return f"{split}/conversations.jsonl"


def split_conversations(conversations: list[Conversation], options: InstructOptions) -> dict[str, list]:
    """A seeded shuffle cut into train/val/test by conversation (never a conversation across splits)."""
    order = list(range(len(conversations)))
    random.Random(options.seed).shuffle(order)
    n = len(order)
    n_test = int(round(n * options.test_fraction))
    n_val = int(round(n * options.val_fraction))
    if n - n_test - n_val < 1:
        raise DataError(f"{n} conversations leave none for training with val_fraction {options.val_fraction} "
                        f"and test_fraction {options.test_fraction}; lower them or bring more data.")
    test, val, train = order[:n_test], order[n_test:n_test + n_val], order[n_test + n_val:]
    splits = {"train": train, "val": val, "test": test}
    return {name: [conversations[i] for i in sorted(idx)] for name, idx in splits.items() if idx}


def _write_conversations(directory: Path, split: str, conversations: list[Conversation]) -> dict[str, Any]:
    lines = "".join(json.dumps({"messages": _with_weights(c), "source": c.source}) + "\n" for c in conversations)
    data = lines.encode()
    name = conversations_file(split)
    atomic_write_bytes(directory / name, data)
    return {name: {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


def _with_weights(conversation: Conversation) -> list[dict[str, Any]]:
    """The messages, with `"weight": 0` on answers that were context only (as OpenAI's format writes it)."""
    return [{**m, "weight": 0} if t.role == "assistant" and not t.trains else m
            for t, m in zip(conversation.turns, conversation.as_messages())]


def prepare_chat(to: Path, source: Path, options: Any, notes: list[str] | None = None) -> dict[str, Any]:
    """`trainwise prepare` of instruction data (called by data/prepare.py): the manifest's fields. `notes`:
    what the caller found about the source (mixed formats), kept with the manifest's notes."""
    from trainwise.data.prepare_options import held_out_file, test_file_note
    from trainwise.data.text.tokenizer import resolve_tokenizer

    instruct = InstructOptions.from_prepare(options)
    read = read_chat_files(chat_files(source), instruct.format)
    held = held_out_file(source, options)
    test = _read_test_file(held, instruct.format, read) if held is not None else None
    ignored = ignored_files(source)
    notes = list(notes or []) + ([f"ignored {len(ignored)} file{'s' if len(ignored) > 1 else ''} not holding "
                                  f"JSONL, JSON or Parquet rows (chat data is read from those only): "
                                  f"{', '.join(ignored[:5])}{' ...' if len(ignored) > 5 else ''}"] if ignored else [])
    builtin = BUILTIN_TEMPLATES.get(instruct.template or "")
    # a BPE trained here learns the template's text, its markers as special ids (`<|im_end|>` one id, an eos)
    texts = ("".join(s.text for s in builtin.segments(c.as_messages())) if builtin else
             "\n".join(m["content"] for m in c.as_messages()) for c in read.conversations)
    tokenizer = resolve_tokenizer(options.tokenizer, options.train_tokenizer, texts, builtin.markers if builtin else ())
    fields = prepare_instructions(read, to, tokenizer, instruct, test=test).fields
    if held is not None:
        notes.append(test_file_note(options, len(test or []), "conversations"))
    fields["notes"] = notes + fields["notes"]
    return fields


def _read_test_file(path: Path, fmt: str, read: ReadResult) -> list[Conversation]:
    """`--test-file`'s conversations, read and checked as the source's are: a bad row is skipped and named by
    file:line with the source's (in `read`); a file with no usable row is refused, naming the option."""
    try:
        held = read_chat_files(chat_files(path), fmt)  # type: ignore[arg-type]
    except DataError as error:
        raise DataError(f"--test-file {path}: {error}") from None
    read.problems += held.problems
    read.repaired += held.repaired
    return held.conversations


def prepare_instructions(read: ReadResult, out: Path, tokenizer: Any, options: InstructOptions,
                         test: list[Conversation] | None = None) -> InstructResult:
    """Render, mask, split and write conversations already read; the manifest's fields and the counts. `test`:
    held-out conversations of their own (`--test-file`), added to the test split."""
    template = choose_template(options.template, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.max_id + 1)
    entries, files, stats = {}, {}, {}
    copies = SplitCopies()
    splits = split_conversations(read.conversations, options)
    if test:
        splits["test"] = splits.get("test", []) + test
    for split, conversations in splits.items():
        for conversation in conversations:
            copies.add(split, conversation.source, json.dumps(conversation.as_messages()))
        samples, stats[split] = encode_all(conversations, template, tokenizer, max_tokens=options.seq_len,
                                           too_long=options.too_long, mask_prompt=options.mask_prompt)
        read.problems += stats[split].problems  # skipped rows, listed with those the reader skipped
        writer = TokenSplitWriter(out, split, dtype, eos_id=None, with_loss_mask=True)  # samples end themselves
        for sample in samples:
            writer.add(sample.ids, [int(t) for t in sample.trains])
        entries[split], side = writer.close()
        entries[split]["unit"] = "conversations"
        files.update(side)
        if split != "train":
            files.update(_write_conversations(out, split, conversations))
    tokenizer.save(out / TOKENIZER_DIR)
    save_template_choice(out / TOKENIZER_DIR, template)  # copied into each run with the tokenizer
    fields = {
        "task": "causal_lm", "schema": text_schema(dtype, with_loss_mask=True), "splits": entries, "files": files,
        "tokenizer": tokenizer.describe(), "lengths": length_report(stats["train"].lengths, options.seq_len),
        "notes": repair_notes(read.repaired) + copies.notes(),
        "skipped": {"count": read.skipped, "files": [_skipped(p) for p in read.problems[:1000]]},
        "instruct": {"format": read.format, "template": template_record(template), "seq_len": options.seq_len,
                     "too_long": options.too_long, "mask_prompt": options.mask_prompt,
                     "stats": {split: s.as_dict() for split, s in stats.items()}},
    }
    return InstructResult(fields, read, stats)


def _skipped(problem: str) -> dict[str, str]:
    where, _, why = problem.partition(": ")
    return {"file": where, "reason": why}


def read_held_out(directory: str | Path, split: str = "val") -> list[Conversation]:
    """The held-out conversations a prepared instruction dataset kept for evaluation (empty if none)."""
    path = Path(directory) / conversations_file(split)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        turns = tuple(Turn(m["role"], m["content"], m.get("weight", 1)) for m in row["messages"])
        out.append(Conversation(turns, row.get("source", "")))
    return out


def summary_lines(manifest: dict[str, Any]) -> list[str]:
    """What `prepare` prints for instruction data, after the text lines (tokens, tokenizer, histogram)."""
    instruct = manifest["instruct"]
    train = instruct["stats"]["train"]
    template = instruct["template"]["name"]
    return [f"instruction data ({instruct['format']}), chat template {template}: {train['samples']:,} training "
            f"samples; tokens carrying loss (assistant answers): {train['loss_share']:.1%}"
            + ("" if instruct["mask_prompt"] else " (prompt masking off: every token trains)"),
            f"longer than {instruct['seq_len']:,} tokens: {train['truncated']} truncated from the prompt side, "
            f"{train['dropped_too_long']} dropped (--too-long {instruct['too_long']}); "
            f"{sum(s['dropped_no_answer'] for s in instruct['stats'].values())} dropped with an empty answer"
            + _blank_context(instruct["stats"])]


def _blank_context(stats: dict[str, dict[str, Any]]) -> str:
    blank = sum(s.get("blank_answers_as_context", 0) for s in stats.values())
    return f"; {blank} blank answer{'s' if blank > 1 else ''} of multi-turn chats kept as context (no loss)" \
        if blank else ""
