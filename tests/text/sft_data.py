"""A small generated instruction set and a tiny Llama-style config for the fine-tuning tests: prepared once
per module, trained in a few steps."""
from __future__ import annotations

import json
import random
from pathlib import Path

from trainwise.config import config_from_dict
from trainwise.data.prepare import PrepareOptions
from trainwise.data.prepare import prepare_corpus as prepare

TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 128, "vocab_size": 300}


def reverse_chats(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice("abcdefgh") for _ in range(4)]
        rows.append({"messages": [{"role": "user", "content": "reverse " + " ".join(words)},
                                  {"role": "assistant", "content": " ".join(reversed(words))}]})
    return rows


def prepared_chats(directory: Path, n: int = 80) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in reverse_chats(n)))
    prepare(source, directory / "ds", PrepareOptions(template="chatml", train_tokenizer=300, seq_len=48,
                                                     val_fraction=0.1, test_fraction=0.0))
    (directory / "llama").mkdir(exist_ok=True)
    (directory / "llama" / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


def sft_config(directory: Path, **model):
    return config_from_dict({
        "seed": 0, "model": {"name": None, "hf_config": str(directory / "llama"), "method": "lora",
                             "lora": {"rank": 4, "dropout": 0.1}, **model},
        "data": {"name": "prepared", "path": str(directory / "ds"), "num_workers": 0, "seq_len": 96},
        "optim": {"name": "adamw", "lr": 0.003}, "schedule": {"warmup_steps": 2},
        "train": {"max_steps": 6, "batch_size": 4, "log_every": 2, "device": "cpu", "sanity": False},
        "eval": {"every_steps": 3}, "checkpoint": {"every_steps": 3}, "telemetry": {"enabled": False}},
        source="test")
