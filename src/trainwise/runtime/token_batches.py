"""Running a language model on token batches, which the engine and evaluation share.

The batch contract: a token batch is a dict of `input_ids`, `labels` (aligned with the outputs, -100 = no
loss), `position_ids` and optionally `attention_mask`, each [B, T]; the model is called with the inputs by
name (never the labels) and returns logits or an object with `.logits`.

`token_metrics` measures a model on such batches, streamed: no logits leave the device, one transfer at the
end. It is what validation during training logs (loss, perplexity, token accuracy); `detailed` adds what
`trainwise eval` reports: the loss by position in the document (how much context helps), and the most
frequent wrong next-token guesses (a vocabulary has no readable confusion matrix).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from trainwise.data.batch import IGNORE_INDEX, model_inputs


def model_logits(outputs: object) -> torch.Tensor:
    """A language model's logits: the tensor it returned, or its output object's `.logits`."""
    return outputs.logits if hasattr(outputs, "logits") else outputs  # type: ignore[return-value]


def call_model(forward: Callable, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """`forward(input_ids=..., position_ids=..., [attention_mask=...])`: the logits. Never the labels: the
    loss is computed by the caller."""
    return model_logits(forward(**model_inputs(dict(batch))))


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
                logits = call_model(model, batch).float()
            labels = batch["labels"]
            counted = labels != IGNORE_INDEX
            losses = nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX,
                                                 reduction="none").view(labels.shape)
            guesses = logits.argmax(-1)
            del logits
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

