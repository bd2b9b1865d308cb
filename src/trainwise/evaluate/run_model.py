"""A text run's model and tokenizer, rebuilt from its directory alone (for `generate` and `export`).

The run directory holds what is needed: config.yaml (the model), model.safetensors (the final weights) and
tokenizer/ (the tokenizer its data was made with, and the sequence length); no data is read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainwise.data.bundle import DataSpec
from trainwise.errors import RunDirError
from trainwise.rundir import RunDir
from trainwise.runtime.model_state import StateMismatch, load_kept_state, saved_record
from trainwise.data.text.tokenizer import Tokenizer, load_tokenizer, recorded_sequence_length


@dataclass
class RunModel:
    run: RunDir
    config: Any  # RunConfig
    model: nn.Module
    tokenizer: Tokenizer
    spec: DataSpec


def load_run_model(path: str | Path, *, device: str | torch.device = "cpu", trust_code: bool = False) -> RunModel:
    """The run's model with its final weights, and its tokenizer."""
    from trainwise.recipes.factories import build_model
    from trainwise.rundir.trust import require_trust
    from trainwise.rundir.weights import load_weights

    run = RunDir.open(path)
    config = run.read_config()
    require_trust(run, config, trust_code=trust_code, command="generate")
    if not run.tokenizer_dir().is_dir():
        raise RunDirError(f"{run.path} has no tokenizer/: it is not a language-model run (or it was trained on "
                          "text before runs kept their tokenizer; train it again).")
    if not run.model_path.is_file():
        raise RunDirError(f"{run.path} has no final weights (model.safetensors): did the run complete? Resume it "
                          f"with `trainwise resume {run.path}`.")
    tokenizer = load_tokenizer(run.tokenizer_dir())
    seq_len = recorded_sequence_length(run.tokenizer_dir()) or config.data.seq_len or 256
    spec = DataSpec(input_shape=(seq_len,), num_classes=tokenizer.vocab_size, task="causal_lm",
                    input_dtype=torch.int64, tokenizer_fingerprint=tokenizer.fingerprint)
    model = build_model(config, spec)
    state, _, weights = load_weights(run, "final")
    try:  # a LoRA or freeze run keeps only what trained: it goes onto the rebuilt base
        load_kept_state(model, state, saved_record(weights))
    except StateMismatch as error:
        raise RunDirError(f"{run.model_path} does not fit the model built from {run.config_path}: "
                          f"{str(error).splitlines()[0]} Was config.yaml edited after training?") from None
    return RunModel(run, config, model.to(device).eval(), tokenizer, spec)

