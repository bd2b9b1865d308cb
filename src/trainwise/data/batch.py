"""The batch contract: what a micro-batch is, which of its keys a model is called with, how its tokens are
counted and how its loss is summed. Every language-model path (the engine, the planner, evaluation) asks here.

A micro-batch is `(inputs, targets)`, or a token batch: a dict of `input_ids`, `labels` (aligned with the
outputs: `labels[t]` is the id expected at output t, IGNORE_INDEX where no loss is due) and `position_ids`
(restarting at 0 at every document of a packed row), each [B, T]. Packing is told to a model by the position
ids alone: no hand-made attention mask. transformers derives each family's own mask from them (causal, sliding
window, soft-capped eager; GQA kept), the built-in gpt its per-document attention (text/gpt.py).

The token loss is the SUM of token cross-entropies; the engine divides once by the step's label-token count
(`label_count`, over every micro-batch and rank). `chunked_token_loss_sum` gives the same sum from the last
hidden state and the output head, `chunk_size` tokens at a time, so the [tokens x vocab] logits never exist.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainwise.config.labels import IGNORE_INDEX
from trainwise.errors import ConfigError

MicroBatch = tuple[torch.Tensor, torch.Tensor] | Mapping[str, torch.Tensor]
MODEL_INPUTS = ("input_ids", "position_ids", "attention_mask", "document_lengths")
# FlashAttention's variable-length kernel: the documents' cumulative starts and the longest, known on the host
FLASH_INPUTS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def is_token_batch(batch: object) -> bool:
    return isinstance(batch, Mapping)


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch's keys the model is called with (never labels: the loss is computed by the caller)."""
    return {key: batch[key] for key in MODEL_INPUTS + FLASH_INPUTS if batch.get(key) is not None}


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: where a document starts. A document starts where the position does not follow the previous
    one (transformers' rule for packed rows), and every row starts one; padding after a pack is its own."""
    starts = torch.diff(position_ids, dim=-1, prepend=position_ids[:, :1] - 1) != 1
    starts[:, 0] = True
    return starts


def document_lengths(position_ids: torch.Tensor) -> list[list[int]]:
    """Per row, the lengths of its documents, read from the host tensor the loader made (before the copy, so
    the step never waits for the device): the built-in gpt attends within each (text/gpt.py)."""
    if position_ids.device.type != "cpu":
        raise ValueError("document_lengths reads the position ids on the host: call it before the copy")
    rows = []
    for starts in document_starts(position_ids):
        bounds = torch.nonzero(starts).reshape(-1).tolist() + [position_ids.shape[-1]]
        rows.append([end - start for start, end in zip(bounds[:-1], bounds[1:])])
    return rows


def flattened_for_varlen(batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A token batch as FlashAttention's variable-length kernel takes it: the rows' real tokens laid end to end
    in one row [1, N] (the padding left out: the kernel needs no rectangle), with the documents' boundaries
    (`cu_seq_lens_*`, `max_length_*`) computed here, on the host tensors the loader made, so the step never
    waits for the device to find them. A document starts where its position id does not follow the previous
    one (as transformers detects packing), and every row starts one."""
    positions = batch["position_ids"]
    if positions.device.type != "cpu":
        raise ValueError("flattened_for_varlen reads the position ids on the host: call it before the copy")
    kept = torch.arange(positions.shape[-1]) < real_lengths(batch["labels"]).unsqueeze(-1)
    if not bool(kept.any()):  # no label anywhere: keep the rows whole rather than send nothing
        kept = torch.ones_like(kept)
    flat = {key: batch[key][kept].unsqueeze(0) for key in ("input_ids", "labels", "position_ids")}
    starts = torch.nonzero(document_starts(positions)[kept]).reshape(-1).to(torch.int32)
    bounds = torch.cat([starts, torch.tensor([int(kept.sum())], dtype=torch.int32)])
    longest = int((bounds[1:] - bounds[:-1]).max())
    flat.update(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=longest, max_length_k=longest)
    return flat


def real_lengths(labels: torch.Tensor) -> torch.Tensor:
    """[B]: each row's tokens before its padding. Packing pads a row's tail, which carries no label; a row's
    real tokens end one past its last label (that label's token is real, and so is the document's final token,
    which has no label of its own); a row without labels counts none."""
    length = labels.shape[-1]
    last = torch.where(labels != IGNORE_INDEX, torch.arange(length), -1).amax(dim=-1)
    return torch.where(last >= 0, (last + 2).clamp(max=length), 0)


def label_tokens(micro_batches: Sequence[Mapping[str, torch.Tensor]]) -> torch.Tensor:
    """The step's tokens that carry loss, counted where the labels are (host memory: no device work)."""
    return torch.as_tensor(sum((batch["labels"] != IGNORE_INDEX).sum() for batch in micro_batches))


def real_tokens(micro_batches: Sequence[Mapping[str, torch.Tensor]]) -> int:
    """The tokens of token batches that are not padding (real_lengths), counted on the host batches."""
    return sum(int(real_lengths(batch["labels"]).sum()) for batch in micro_batches)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of cross-entropies over the label tokens (fp32 accumulation; IGNORE_INDEX ignored)."""
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
