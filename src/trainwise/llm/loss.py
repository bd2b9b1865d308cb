"""A causal LM taken apart for a chunked loss: its last hidden state and its output head.

The summed token loss and its chunked form live with the batch contract (data/batch.py); the engine's
`TokenLossModel` (train/step/train_step.py) runs the backbone and the chunked head inside one forward, so DDP, FSDP and
torch.compile see the whole computation.

Hugging Face causal LMs (also inside peft) give the two apart; another model qualifies by having a
`hidden_states(**inputs)` method and an `lm_head` / `head` Linear.
"""
from __future__ import annotations


import torch
from torch import nn

from trainwise.errors import ConfigError
from trainwise.llm.methods import output_head


def head_and_softcap(model: nn.Module) -> tuple[nn.Module, float | None]:
    """The output head and the final logit soft-cap of a model that allows chunking (ConfigError otherwise)."""
    inner = _unwrapped(model)
    head = output_head(inner)
    backbone = getattr(inner, "base_model", None)
    has_hidden = callable(getattr(inner, "hidden_states", None)) or \
        (isinstance(backbone, nn.Module) and backbone is not inner)
    if head is None or not has_hidden:
        raise ConfigError(f"model.loss_chunk_size needs the model's hidden states and head apart, and "
                          f"{type(inner).__name__} does not expose them; leave model.loss_chunk_size unset")
    return head, getattr(getattr(inner, "config", None), "final_logit_softcapping", None)


def last_hidden_state(model: nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    """The model's last hidden state. A Hugging Face model computes it in its own forward, asked for no logits
    (`logits_to_keep` empty) and the backbone's output caught on the way out: every hook on the model runs, FSDP's
    gathering of the root's weights (embeddings, final norm, head) included, which calling the backbone alone
    would skip."""
    inner = _unwrapped(model)
    own = getattr(inner, "hidden_states", None)
    if callable(own):
        return own(**inputs)
    caught: list[torch.Tensor] = []
    handle = inner.base_model.register_forward_hook(lambda module, args, output: caught.append(
        output.last_hidden_state))
    try:
        model(**inputs, logits_to_keep=torch.empty(0, dtype=torch.long, device=inputs["input_ids"].device))
    finally:
        handle.remove()
    return caught[-1]


def _unwrapped(model: nn.Module) -> nn.Module:
    return model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
