"""`trainwise prepare` for instruction data: JSONL conversations -> token shards with a loss mask.

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

from trainwise.atomic import atomic_write_bytes
from trainwise.data.shards import read_manifest, write_manifest
from trainwise.errors import DataError
from trainwise.text.chat import Conversation, ReadResult, Turn, read_chat_files
from trainwise.text.chat_templates import BUILTIN_TEMPLATES, ChatTemplate, JinjaTemplate, choose_template
from trainwise.text.instruct import EncodeStats, TooLong, encode_all
from trainwise.text.tokens import TOKENIZER_DIR, TokenSplitWriter, text_schema, token_dtype


@dataclass(frozen=True)
class InstructOptions:
    format: str = "auto"          # auto | alpaca | sharegpt | messages
    template: str | None = None   # a built-in name, or None: the tokenizer's own chat template
    seq_len: int = 1024           # the longest sample kept (tokens)
    too_long: TooLong = "truncate"
    mask_prompt: bool = True      # False: every token carries loss (an ablation, reported as such)
    val_fraction: float = 0.1
    test_fraction: float = 0.0
    seed: int = 0


@dataclass
class InstructResult:
    manifest: dict[str, Any]
    read: ReadResult
    stats: dict[str, EncodeStats]


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
    lines = "".join(json.dumps({"messages": c.as_messages(), "source": c.source}) + "\n" for c in conversations)
    data = lines.encode()
    name = conversations_file(split)
    atomic_write_bytes(directory / name, data)
    return {name: {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


def template_record(template: ChatTemplate) -> dict[str, Any]:
    """What the manifest keeps so a run renders prompts with the same template."""
    if isinstance(template, JinjaTemplate):
        return {"name": "tokenizer", "special_tokens": template.special_tokens}
    return {"name": template.name}


def template_from_record(record: dict[str, Any], tokenizer: Any) -> ChatTemplate:
    if record.get("name") in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[record["name"]]
    return choose_template(None, tokenizer)


def prepare_instructions(sources: list[Path], out: Path, tokenizer: Any,
                         options: InstructOptions) -> InstructResult:
    """Read, render, mask, split and write; returns the manifest and the counts `prepare` prints."""
    read = read_chat_files(sources, options.format)
    template = choose_template(options.template, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    entries, files, stats = {}, {}, {}
    for split, conversations in split_conversations(read.conversations, options).items():
        samples, stats[split] = encode_all(conversations, template, tokenizer, max_tokens=options.seq_len,
                                           too_long=options.too_long, mask_prompt=options.mask_prompt)
        writer = TokenSplitWriter(out, split, dtype, eos_id=tokenizer.eos_id, with_loss_mask=True)
        for sample in samples:
            writer.add(sample.ids, [int(t) for t in sample.trains])
        entries[split], side = writer.close()
        files.update(side)
        if split != "train":
            files.update(_write_conversations(out, split, conversations))
    tokenizer.save(out / TOKENIZER_DIR)
    manifest = {
        "kind": "text", "task": "causal_lm", "schema": text_schema(dtype, with_loss_mask=True),
        "splits": entries, "files": files, "tokenizer": tokenizer.describe(),
        "instruct": {"format": read.format, "template": template_record(template), "seq_len": options.seq_len,
                     "too_long": options.too_long, "mask_prompt": options.mask_prompt,
                     "skipped_rows": read.problems[:100], "skipped_count": read.skipped,
                     "stats": {split: s.as_dict() for split, s in stats.items()}},
    }
    write_manifest(out, manifest)
    return InstructResult(read_manifest(out), read, stats)


def read_held_out(directory: str | Path, split: str = "val") -> list[Conversation]:
    """The held-out conversations a prepared instruction dataset kept for evaluation (empty if none)."""
    path = Path(directory) / conversations_file(split)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.append(Conversation(tuple(Turn(m["role"], m["content"]) for m in row["messages"]), row.get("source", "")))
    return out


def describe_stats(result: InstructResult) -> list[str]:
    """The lines `prepare` prints: loss share, truncation, and the length histogram of the training split."""
    train = result.stats["train"]
    lines = [f"{result.read.format}: {len(result.read.conversations):,} conversations"
             + (f", {result.read.skipped} rows skipped" if result.read.skipped else ""),
             f"tokens carrying loss (assistant answers): {train.loss_share:.1%} of {train.tokens:,} training tokens",
             f"over {result.manifest['instruct']['seq_len']} tokens: {train.truncated} truncated from the prompt side, "
             f"{train.dropped_too_long} dropped"]
    lines.append("sample lengths (tokens): " + ", ".join(f"{label}: {count}" for label, count in train.histogram()))
    if result.read.problems:
        lines.append("skipped rows:\n" + result.read.problem_summary())
    return lines
