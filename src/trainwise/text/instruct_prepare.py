"""`trainwise prepare` for instruction data: conversations (JSONL, JSON, Parquet) -> token shards with a loss mask.

The dataset is an ordinary text dataset (text/tokens.py: tokens, document offsets, the tokenizer) whose
`loss_mask` marks the assistant's tokens, so packing (text/packing.py) gives -100 to every prompt token and keeps
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
from trainwise.text.chat import Conversation, ReadResult, Turn, chat_files, read_chat_files
from trainwise.text.chat_templates import BUILTIN_TEMPLATES, choose_template, save_template_choice, template_record
from trainwise.text.instruct import EncodeStats, TooLong, encode_all
from trainwise.text.packing import length_report
from trainwise.text.rows import chat_keys, first_keys, is_row_file
from trainwise.text.tokens import TOKENIZER_DIR, TokenSplitWriter, text_schema, token_dtype


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


def looks_like_chat(source: Path) -> bool:
    """Row files (JSONL, JSON, Parquet) whose first row is alpaca, sharegpt, messages or prompt-completion (so
    `prepare` needs no --kind)."""
    files = chat_files(source) if source.exists() else []
    return bool(files) and is_row_file(files[0]) and chat_keys(first_keys(files[0]))


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


def prepare_chat(to: Path, source: Path, options: Any) -> dict[str, Any]:
    """`trainwise prepare` of instruction data (called by data/prepare.py): the manifest's fields."""
    from trainwise.text.tokenizer import resolve_tokenizer

    instruct = InstructOptions.from_prepare(options)
    read = read_chat_files(chat_files(source), instruct.format)
    builtin = BUILTIN_TEMPLATES.get(instruct.template or "")
    # a BPE trained here learns the template's markup too (`<|im_start|>` becomes one id, not ten)
    texts = ("".join(s.text for s in builtin.segments(c.as_messages())) if builtin else
             "\n".join(m["content"] for m in c.as_messages()) for c in read.conversations)
    tokenizer = resolve_tokenizer(options.tokenizer, options.train_tokenizer, texts)
    return prepare_instructions(read, to, tokenizer, instruct).fields


def prepare_instructions(read: ReadResult, out: Path, tokenizer: Any, options: InstructOptions) -> InstructResult:
    """Render, mask, split and write conversations already read; the manifest's fields and the counts."""
    template = choose_template(options.template, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    entries, files, stats = {}, {}, {}
    for split, conversations in split_conversations(read.conversations, options).items():
        samples, stats[split] = encode_all(conversations, template, tokenizer, max_tokens=options.seq_len,
                                           too_long=options.too_long, mask_prompt=options.mask_prompt)
        read.problems += stats[split].problems  # skipped rows, listed with those the reader skipped
        writer = TokenSplitWriter(out, split, dtype, eos_id=None, with_loss_mask=True)  # samples end themselves
        for sample in samples:
            writer.add(sample.ids, [int(t) for t in sample.trains])
        entries[split], side = writer.close()
        files.update(side)
        if split != "train":
            files.update(_write_conversations(out, split, conversations))
    tokenizer.save(out / TOKENIZER_DIR)
    save_template_choice(out / TOKENIZER_DIR, template)  # copied into each run with the tokenizer
    fields = {
        "task": "causal_lm", "schema": text_schema(dtype, with_loss_mask=True), "splits": entries, "files": files,
        "tokenizer": tokenizer.describe(), "lengths": length_report(stats["train"].lengths, options.seq_len),
        "notes": [], "skipped": {"count": read.skipped, "files": [_skipped(p) for p in read.problems[:1000]]},
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
            f"{train['dropped_too_long']} dropped (--too-long {instruct['too_long']})"]
