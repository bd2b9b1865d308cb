"""A causal LM taken apart for a chunked loss: its last hidden state and its output head.

The summed token loss and its chunked form live with the batch contract (data/batch.py); the engine's
`TokenLossModel` (train/step.py) runs the backbone and the chunked head inside one forward, so DDP, FSDP and
torch.compile see the whole computation.

Hugging Face causal LMs (also inside peft) give the two apart; another model qualifies by having a
`hidden_states(**inputs)` method and an `lm_head` / `head` Linear.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from trainwise.errors import ConfigError
from trainwise.llm.methods import output_head


def hidden_and_head(model: nn.Module) -> tuple[Callable[..., torch.Tensor], nn.Module, float | None]:
    """(inputs -> last hidden state, the head, the final logit soft-cap) of a model that allows chunking."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    own = getattr(inner, "hidden_states", None)
    head = output_head(inner)
    if callable(own) and head is not None:
        return own, head, None
    backbone = getattr(inner, "base_model", None)
    if head is None or not isinstance(backbone, nn.Module) or backbone is inner:
        raise ConfigError(f"model.loss_chunk_size needs the model's hidden states and head apart, and "
                          f"{type(inner).__name__} does not expose them; leave model.loss_chunk_size unset")
    softcap = getattr(getattr(inner, "config", None), "final_logit_softcapping", None)
    return (lambda **inputs: backbone(**inputs).last_hidden_state), head, softcap
