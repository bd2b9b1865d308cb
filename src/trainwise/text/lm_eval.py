"""`trainwise eval` of a text split: the streamed metrics (runtime/token_batches.py) with the wrong guesses
named by their text, and greedy continuations of fixed prompts (the openings of the split's documents)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwise.runtime.token_batches import token_metrics


SAMPLE_PROMPTS = 3  # documents of the split whose opening becomes a prompt
PROMPT_TOKENS = 24
SAMPLE_TOKENS = 48


def split_token_metrics(model: nn.Module, dataset: Any, *, device: torch.device, batch_size: int = 8,
                        detailed: bool = False) -> dict[str, Any]:
    """Loss, perplexity and token accuracy of `model` over every pack of a text split (runtime/token_batches.py);
    `detailed`: with the loss by position and the top confusions (as ids)."""
    model.to(device)
    n = len(dataset)
    batches = (dataset.__getitems__(list(range(i, min(i + batch_size, n)))) for i in range(0, n, batch_size))
    return token_metrics(model, batches, device=device, detailed=detailed)


def evaluate_language_model(model: nn.Module, dataset: Any, *, device: torch.device,
                            batch_size: int = 8) -> tuple[dict[str, Any], tuple[list[str], list[list[Any]]]]:
    """`trainwise eval` of a text split (PackedTextDataset.evaluate_model): the streamed metrics with the loss
    by position and the top confusions named by their text, greedy continuations of fixed prompts (the
    openings of the split's first documents), and the loss by position as the predictions table."""
    from trainwise.text.generate import Sampling, generate_ids
    from trainwise.data.text.tokenizer import load_tokenizer
    from trainwise.data.text.token_shards import TOKENIZER_DIR

    metrics = split_token_metrics(model, dataset, device=device, batch_size=batch_size, detailed=True)
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
