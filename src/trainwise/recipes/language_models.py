"""Hugging Face causal language models as a run's model: `model.hf` (a local directory with weights) or
`model.hf_config` (random initialisation from a config), with `model.method` applied (llm/methods.py).

A base initialised at random is drawn from its own seeded generator (the run's seed), apart from the global RNG:
every rebuild (resume, evaluation, export, generation) gets the same base, which a LoRA or freeze run needs,
since its checkpoints keep only what trains (runtime/model_state.py).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwise.errors import ConfigError


def build_language_model(config: Any, vocab_size: int | None) -> nn.Module:
    """The model `config.model` names (hf or hf_config), in `model.dtype`, with its method applied."""
    from trainwise.llm import hf

    model_config = config.model
    dtype = "bfloat16" if model_config.dtype == "bf16" else "float32"
    if model_config.hf:
        model = hf.load_pretrained(model_config.hf, dtype=dtype)
        have = model.get_input_embeddings().num_embeddings
        if vocab_size and vocab_size > have:
            raise ConfigError(f"the data's tokenizer has {vocab_size:,} ids, the model in {model_config.hf} "
                              f"{have:,}: prepare the data with the model's own tokenizer (--tokenizer "
                              f"{model_config.hf}).")
    else:
        overrides = {"vocab_size": vocab_size} if vocab_size else {}
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(config.seed)
            model = hf.build_model(hf.resolve_config(model_config.hf_config, **overrides), device="cpu", dtype=dtype)
    return with_method(model, config)


def with_method(model: nn.Module, config: Any) -> nn.Module:
    """`model.method` (and gradient checkpointing) applied; the model itself when the method is full."""
    if config.model.method == "full" and not (config.model.gradient_checkpointing and (config.model.hf or
                                                                                         config.model.hf_config)):
        return model
    from trainwise.llm.methods import apply_model_config

    return apply_model_config(model, config.model, device=_run_device(config))


def _run_device(config: Any) -> str:
    device = config.train.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)
