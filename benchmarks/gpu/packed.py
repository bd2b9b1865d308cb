"""A 1B Llama trained on packed rows of 4,096 tokens vs the same documents unpacked, with the attention trainwise
chooses on this machine (llm/hf.py attention_choices: FlashAttention varlen where installed, else FlexAttention,
else SDPA): tokens/s and the allocator's peak for each. Packing reaches the model as position ids only (and, on
FlashAttention, the documents' boundaries read on the host): no [B, 1, T, T] mask, so both should cost the same
per token; the packed one wastes no padding.

Part of benchmarks/gpu/run.sh (bench.py); on a machine without CUDA only the dry run (tiny sizes, CPU) runs.
"""
from __future__ import annotations

import gc
import time

import torch

LENGTH, DOCUMENTS = 4096, 8


def rows(packed: bool, vocabulary: int, length: int, documents: int) -> dict[str, torch.Tensor]:
    """The same `documents` documents of length/documents tokens: one packed row, or one row each."""
    piece = length // documents
    ids = torch.randint(0, vocabulary, (documents, piece + 1), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:].clone(),
             "position_ids": torch.arange(piece).expand(documents, piece)}
    batch["labels"][:, -1] = -100  # a document's last token has no next token of its own
    if packed:
        batch = {key: value.reshape(1, -1) for key, value in batch.items()}
    return batch


def timed_steps(step, batch: dict, device: str, steps: int) -> tuple[float, int | None]:
    """Seconds per step (after one warm-up step) and the allocator's peak (CUDA)."""
    step([batch])
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for _ in range(steps):
        step([batch])
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps, torch.cuda.max_memory_allocated() if device == "cuda" else None


def llama_1b_packed(dry: bool, device: str) -> dict:
    from trainwise.llm import hf
    from trainwise.train.step.train_step import StepSettings, TrainStep

    if device == "cuda" and not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    length, documents, steps = (64, 4, 2) if dry else (LENGTH, DOCUMENTS, 10)
    shrunk = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=512) if dry else {}
    config = hf.resolve_config("llama-3.2-1b", **shrunk)
    attention = hf.attention_choices(device)
    result: dict = {"seq_len": length, "documents_per_row": documents, "steps": steps}
    for packed in (True, False):
        gc.collect()  # what earlier sections (or the first case) left in reference cycles is freed before this
        if device == "cuda":  # model is built, so the peak counts this case alone
            torch.cuda.empty_cache()
        torch.manual_seed(0)
        model = hf.build_model(config, device=device, dtype="bf16" if not dry else "fp32",
                               attention=attention)
        model.config.use_cache = False
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
        settings = StepSettings(precision="fp32" if dry else "bf16", task="causal_lm")
        step = TrainStep.from_settings(model.train(), optimizer, settings, device=torch.device(device))
        seconds, peak = timed_steps(step, rows(packed, config.vocab_size, length, documents), device, steps)
        result["attention"] = hf.attention_of(model)
        result["packed" if packed else "unpacked"] = {"tokens_per_s": length / seconds, "peak_allocated_bytes": peak}
        del model, optimizer, step
    result["packed_over_unpacked_tokens_per_s"] = (result["packed"]["tokens_per_s"]
                                                   / result["unpacked"]["tokens_per_s"])
    return result
