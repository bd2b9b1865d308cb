"""`trainwise eval MODEL --data DIR`: a language model that no run trained, scored on a prepared dataset's split.

MODEL is what `model.hf` takes: a local Hugging Face directory (config.json + weights + tokenizer) or a GGUF file.
It is built as the `lm-continue` recipe builds it (all weights, fp32) and measured as `trainwise eval RUN`
measures a run: loss, perplexity and token accuracy on the split (on the answers only for instruction data), and
for instruction data the model's greedy answer to every held-out prompt with exact match. The data must be
prepared with the model's tokenizer (`trainwise prepare ... --tokenizer MODEL`), as for training; so the figures
are the "before" of a fine-tune or continued pretraining on the same data. Nothing is written.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainwise.errors import DataError

BEFORE_RECIPE = "lm-continue"  # all weights as loaded, fp32: the model as it is


def evaluate_model_on_data(model: str | os.PathLike, data: str | os.PathLike, split: str = "test", *,
                           device: str = "auto") -> dict[str, Any]:
    """MODEL's metrics on `split` of the prepared dataset `data` (see the module docstring)."""
    from trainwise.data.shards import read_manifest
    from trainwise.evaluate.finetune import instruction_scores
    from trainwise.evaluate.metric_warnings import metric_warnings
    from trainwise.evaluate.run_eval import SPLITS
    from trainwise.evaluate.tasks import own_evaluation
    from trainwise.recipes import load_recipe
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.runtime.device import resolve_device
    from trainwise.data.text.token_shards import TOKENIZER_DIR

    if split not in SPLITS:
        raise DataError(f"--split {split!r}: choose one of {', '.join(SPLITS)}.")
    data = Path(data).expanduser()
    kind = read_manifest(data)["kind"]  # a missing or damaged manifest says so itself
    if kind != "text":
        raise DataError(f"--data {data}: a prepared {kind} dataset; `trainwise eval MODEL --data DIR` scores a "
                        "language model on text or instruction data prepared with its tokenizer (`trainwise "
                        "prepare SOURCE --to DIR --tokenizer MODEL`). A run on this data: `trainwise eval RUN`.")
    config = load_recipe(BEFORE_RECIPE)
    config.model.hf, config.data.path = str(model), str(data)
    bundle = build_data(config)
    dataset = getattr(bundle, split)
    if dataset is None or len(dataset) == 0:
        raise DataError(f"--data {data} holds no {split} split (prepare held none out); evaluate another with "
                        "--split val, or prepare it again with --test-fraction or --test-file.")
    built = build_model(config, bundle.spec)  # refuses data prepared with another tokenizer
    where = resolve_device(device)
    metrics, _ = own_evaluation(dataset)(built, device=where)
    answers = instruction_scores(data / TOKENIZER_DIR, data, built, split, device=where)
    if answers is not None:  # instruction data: the model's own answers to the held-out prompts
        metrics["generations"] = answers.pop("generations")
        metrics["instruct"] = answers
    return {"model": str(model), "data": str(data), "split": split, "checkpoint": "untrained", **metrics,
            "warnings": metric_warnings(metrics)}
