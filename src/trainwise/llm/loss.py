"""Causal-LM loss as the batch contract wants it: the SUM of token cross-entropies (labels already aligned with
the outputs, -100 = no loss) — the engine divides once by the step's label-token count.

`chunk_size=None` takes the model's logits. With a chunk size the [tokens x vocab] logits never exist at once:
the model runs up to its last hidden state, and the head + cross-entropy run `chunk_size` tokens at a time;
forward keeps no logits and backward rebuilds one chunk's at a time.

    total = lm_loss_sum(model, batch, chunk_size=1024)   # what the engine's TrainStep does per micro-batch

Chunking needs the hidden states and the head apart: Hugging Face causal LMs (also inside peft) give them; another
model qualifies by having a `hidden_states(**inputs)` method and an `lm_head` / `head` Linear.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainwise.errors import ConfigError
from trainwise.llm.methods import output_head

IGNORE_INDEX = -100
MODEL_INPUTS = ("input_ids", "position_ids", "attention_mask")


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of cross-entropies over the label tokens (fp32 accumulation; -100 ignored)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


class _LinearCrossEntropy(torch.autograd.Function):
    """sum CE(softcap(hidden @ weight.T + bias), labels), `chunk` rows at a time. Forward keeps no logits;
    backward recomputes one chunk's logits at a time and writes the gradients of hidden and weight in place
    (one weight-gradient buffer, not one per chunk as autograd's accumulation of chunked graphs would hold)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk, softcap):
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, labels.numel(), chunk):
            piece = slice(start, start + chunk)
            total += token_loss_sum(_capped_logits(hidden[piece], weight, bias, softcap), labels[piece])
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.chunk, ctx.softcap = chunk, softcap
        return total

    @staticmethod
    def backward(ctx, grad_total):
        hidden, weight, bias, labels = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        d_hidden = torch.empty_like(hidden) if need_hidden else None
        d_weight = torch.zeros_like(weight) if need_weight else None
        d_bias = torch.zeros_like(bias) if need_bias else None
        for start in range(0, labels.numel(), ctx.chunk):
            piece = slice(start, start + ctx.chunk)
            grad = _logit_gradient(hidden[piece], weight, bias, labels[piece], ctx.softcap, grad_total)
            if need_hidden:
                torch.matmul(grad, weight, out=d_hidden[piece])
            if need_weight:
                d_weight.addmm_(grad.t(), hidden[piece])
            if need_bias:
                d_bias += grad.sum(0)
        return d_hidden, d_weight, d_bias, None, None, None


def _capped_logits(hidden, weight, bias, softcap):
    logits = F.linear(hidden, weight, bias).float()
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def _logit_gradient(hidden, weight, bias, labels, softcap, grad_total):
    """d(sum CE)/d(logits) of one chunk, in the weight's dtype: softmax - one_hot, zero on ignored rows."""
    capped = _capped_logits(hidden, weight, bias, softcap)
    grad = torch.softmax(capped, dim=-1)
    kept = labels != IGNORE_INDEX
    targets = torch.where(kept, labels, torch.zeros_like(labels))
    grad.scatter_add_(1, targets.unsqueeze(1), torch.full_like(grad[:, :1], -1.0))
    grad.mul_(kept.unsqueeze(1).to(grad.dtype) * grad_total)
    if softcap:
        grad.mul_(1 - (capped / softcap) ** 2)
    return grad.to(weight.dtype)


def chunked_token_loss_sum(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, chunk_size: int,
                           logit_softcap: float | None = None) -> torch.Tensor:
    """`token_loss_sum(head(hidden), labels)` computed `chunk_size` tokens at a time, never all logits at
    once. A Linear head runs fused (see _LinearCrossEntropy); any other head (e.g. one wrapped by peft) runs
    per chunk under activation checkpointing."""
    if chunk_size < 1:
        raise ConfigError(f"model.loss_chunk_size={chunk_size}: give a positive number of tokens (e.g. 1024)")
    flat_hidden, flat_labels = hidden.flatten(0, -2), labels.flatten()
    if type(head) is nn.Linear:
        return _LinearCrossEntropy.apply(flat_hidden, head.weight, head.bias, flat_labels, chunk_size, logit_softcap)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, flat_labels.numel(), chunk_size):
        piece = slice(start, start + chunk_size)
        total = total + checkpoint(_head_loss, head, flat_hidden[piece], flat_labels[piece], logit_softcap,
                                   use_reentrant=False)
    return total


def _head_loss(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, softcap: float | None) -> torch.Tensor:
    logits = head(hidden).float()
    return token_loss_sum(torch.tanh(logits / softcap) * softcap if softcap else logits, labels)


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


MODEL_INPUTS = ("input_ids", "position_ids", "attention_mask")


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's keys the model is called with (never labels: the loss is computed here)."""
    return {key: batch[key] for key in MODEL_INPUTS if batch.get(key) is not None}


def lm_loss_sum(model: nn.Module, batch: dict[str, Any], chunk_size: int | None = None) -> torch.Tensor:
    """The summed token loss of one micro-batch; chunked (the logits never whole) when `chunk_size` is set."""
    if chunk_size is None:
        output = model(**model_inputs(batch))
        return token_loss_sum(getattr(output, "logits", output), batch["labels"])
    forward, token_loss = chunked_loss_functions(model, chunk_size)
    return token_loss(forward(**model_inputs(batch)), batch["labels"])


class HiddenStates(nn.Module):
    """The model up to its last hidden state, as a module (hooks and `.parameters()` see the model)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self._hidden, self.head, self.softcap = hidden_and_head(model)

    def forward(self, **inputs: Any) -> torch.Tensor:
        return self._hidden(**inputs)


def chunked_loss_functions(model: nn.Module, chunk_size: int):
    """(forward, token_loss) for a step whose loss never holds all logits: `forward(**inputs)` returns the
    last hidden states and `token_loss(hidden, labels)` the summed chunked cross-entropy. The engine and the
    planner install them on a TrainStep (`step.forward`, `step.token_loss`)."""
    forward = HiddenStates(model)

    def token_loss(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return chunked_token_loss_sum(hidden, forward.head, labels, chunk_size, forward.softcap)
    return forward, token_loss


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's keys the model is called with (never labels: the loss is computed here)."""
    return {key: batch[key] for key in MODEL_INPUTS if batch.get(key) is not None}


def lm_loss_sum(model: nn.Module, batch: dict[str, Any], chunk_size: int | None = None) -> torch.Tensor:
    """The summed token loss of one micro-batch; chunked when `chunk_size` is set. (Kept beside
    chunked_loss_functions while the engine (lmtrain) and the planner (llmplan) converge on one of them.)"""
    inputs = model_inputs(batch)
    if chunk_size is None:
        output = model(**inputs)
        return token_loss_sum(getattr(output, "logits", output), batch["labels"])
    hidden_states, head, softcap = hidden_and_head(model)
    return chunked_token_loss_sum(hidden_states(**inputs), head, batch["labels"], chunk_size, softcap)
