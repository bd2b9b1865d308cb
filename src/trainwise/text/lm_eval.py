"""Measuring a language model on token batches, streamed: no logits leave the device, one transfer at the end.

`token_metrics` is what validation during training logs (loss, perplexity, token accuracy); `detailed`
adds what `trainwise eval` reports: the loss by position in the document (how much context helps), and
the most frequent wrong next-token guesses (a vocabulary has no readable confusion matrix);
`evaluate_language_model` adds greedy continuations of fixed prompts.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from trainwise.llm.loss import IGNORE_INDEX, model_inputs

POSITION_BUCKETS = 12  # positions 0, 1, 2-3, 4-7, ... 1024-2047, 2048+ (powers of two)
TOP_CONFUSIONS = 20


def position_bucket(position_ids: torch.Tensor) -> torch.Tensor:
    """0 for position 0, k for positions 2**(k-1) .. 2**k - 1, capped at POSITION_BUCKETS - 1."""
    return torch.floor(torch.log2(position_ids.float() + 1)).long().clamp(max=POSITION_BUCKETS - 1)


def bucket_label(bucket: int) -> str:
    low, high = (0, 0) if bucket == 0 else (2 ** (bucket - 1), 2 ** bucket - 1)
    if bucket == POSITION_BUCKETS - 1:
        return f"{low}+"
    return f"{low}" if low == high else f"{low}-{high}"


@torch.no_grad()
def token_metrics(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], *, device: torch.device,
                  autocast: Callable[[], AbstractContextManager] = nullcontext,
                  detailed: bool = False) -> dict[str, Any]:
    """Loss (mean over label tokens), perplexity and token accuracy over `batches`; with `detailed`, the
    loss per position bucket and the top confusions (ids; the caller names them)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, tokens, correct
    by_position = torch.zeros(2, POSITION_BUCKETS, dtype=torch.float64, device=device)  # loss, tokens
    mistakes: list[torch.Tensor] = []
    try:
        for batch in batches:
            batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
            with autocast():
                output = model(**model_inputs(batch))
            logits = getattr(output, "logits", output).float()
            labels = batch["labels"]
            counted = labels != IGNORE_INDEX
            losses = nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX,
                                                 reduction="none").view(labels.shape)
            guesses = logits.argmax(-1)
            del logits, output
            sums += torch.stack([losses.sum().double(), counted.sum().double(),
                                 ((guesses == labels) & counted).sum().double()])
            if detailed:
                positions = batch.get("position_ids")
                if positions is None:
                    positions = torch.arange(labels.shape[-1], device=device).expand_as(labels)
                bucket = position_bucket(positions)[counted]
                by_position[0].index_add_(0, bucket, losses[counted].double())
                by_position[1].index_add_(0, bucket, torch.ones_like(bucket, dtype=torch.float64))
                wrong = counted & (guesses != labels)
                mistakes.append(torch.stack([labels[wrong], guesses[wrong]], dim=1))
    finally:
        model.train(was_training)
    loss, tokens, correct = sums.tolist()
    mean = loss / max(tokens, 1)
    metrics: dict[str, Any] = {"loss": mean, "perplexity": math.exp(min(mean, 700.0)),
                               "token_accuracy": correct / max(tokens, 1), "tokens": int(tokens)}
    if detailed:
        metrics["loss_by_position"] = _by_position(by_position.cpu())
        metrics["top_confusions"] = _top_confusions(mistakes)
    return metrics


def _by_position(by_position: torch.Tensor) -> list[dict[str, Any]]:
    return [{"positions": bucket_label(b), "tokens": int(by_position[1, b]),
             "loss": float(by_position[0, b] / by_position[1, b])}
            for b in range(POSITION_BUCKETS) if by_position[1, b] > 0]


def _top_confusions(mistakes: list[torch.Tensor]) -> list[dict[str, int]]:
    if not mistakes:
        return []
    pairs, counts = torch.cat(mistakes).cpu().unique(dim=0, return_counts=True)
    order = counts.argsort(descending=True, stable=True)[:TOP_CONFUSIONS]
    return [{"true": int(pairs[i, 0]), "predicted": int(pairs[i, 1]), "count": int(counts[i])} for i in order]


SAMPLE_PROMPTS = 3  # documents of the split whose opening becomes a prompt
PROMPT_TOKENS = 24
SAMPLE_TOKENS = 48


def evaluate_language_model(model: nn.Module, dataset: Any, *, device: torch.device,
                            batch_size: int = 8) -> tuple[dict[str, Any], tuple[list[str], list[list[Any]]]]:
    """`trainwise eval` of a text split (PackedTextDataset.evaluate_model): the streamed metrics with the loss
    by position and the top confusions named by their text, greedy continuations of fixed prompts (the
    openings of the split's first documents), and the loss by position as the predictions table."""
    from trainwise.text.generate import Sampling, generate_ids
    from trainwise.text.tokenizer import load_tokenizer
    from trainwise.text.tokens import TOKENIZER_DIR

    model.to(device)
    n = len(dataset)
    batches = (dataset.__getitems__(list(range(i, min(i + batch_size, n)))) for i in range(0, n, batch_size))
    metrics = token_metrics(model, batches, device=device, detailed=True)
    tokenizer = load_tokenizer(dataset.stream.directory / TOKENIZER_DIR)
    for row in metrics["top_confusions"]:
        row["true"], row["predicted"] = tokenizer.decode([row["true"]]), tokenizer.decode([row["predicted"]])
    stream, samples = dataset.stream, []
    for document in range(min(SAMPLE_PROMPTS, stream.documents)):
        start = int(stream.offsets[document])
        prompt = stream.tokens(start, min(start + PROMPT_TOKENS, int(stream.offsets[document + 1]))).tolist()
        out = generate_ids(model, prompt, Sampling(max_tokens=SAMPLE_TOKENS, temperature=0),
                           eos_id=tokenizer.eos_id, device=device)
        samples.append({"prompt": tokenizer.decode(prompt), "continuation": tokenizer.decode(out)})
    metrics.update(task="causal_lm", samples=int(metrics["tokens"]), generations=samples)
    rows = [[row["positions"], row["tokens"], round(row["loss"], 6)] for row in metrics["loss_by_position"]]
    return metrics, (["positions", "tokens", "loss"], rows)
