"""The built-in `gpt`: a decoder-only transformer small enough to read on one screen.

GPT-2's layout (learned positions, pre-norm blocks, GELU MLP 4x wide, a final LayerNorm, the output head
tied to the token embedding), so `trainwise export` maps it onto transformers' GPT2LMHeadModel one tensor
for one tensor (evaluate/export.py). Given `position_ids` that restart at 0 inside a row (packed documents,
data/text/packing.py), a token sees only the earlier tokens of its own document, so a packed row computes each
document exactly as if alone; no [B, T, T] mask is ever made:
- rows of one document (or no position ids): causal `scaled_dot_product_attention` (the flash kernels);
- on CUDA: FlexAttention with a document block mask (compiled; blocks outside a document are skipped);
- elsewhere: causal SDPA per document, the boundaries read from the position ids on the host.

`model(input_ids=..., position_ids=...)` returns logits [B, T, vocab]; generation passes a `KVCache` to reuse
the keys and values of the tokens already seen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from trainwise.data.batch import document_lengths, document_starts


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    context: int = 256  # the longest sequence (learned position embeddings)
    layers: int = 4
    heads: int = 4
    width: int = 128
    dropout: float = 0.0
    bias: bool = True


class KVCache:
    """Keys and values of the tokens seen so far, per layer, for generation ([B, heads, seen, head_dim])."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers

    @property
    def seen(self) -> int:
        """Tokens seen by the last layer (every layer, between forward calls)."""
        return self.seen_by(len(self.keys) - 1)

    def seen_by(self, layer: int) -> int:
        key = self.keys[layer]
        return 0 if key is None else key.shape[2]

    def extend(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            key = torch.cat([self.keys[layer], key], dim=2)
            value = torch.cat([self.values[layer], value], dim=2)
        self.keys[layer], self.values[layer] = key, value
        return key, value


Documents = object  # a FlexAttention BlockMask (CUDA), or each row's document lengths read on the host


def document_block_mask(position_ids: torch.Tensor):
    """FlexAttention's block mask for packed rows, made once per forward on the device (no sync): a query sees
    the earlier keys of its own document; blocks wholly outside a document are skipped, never computed."""
    from torch.nn.attention.flex_attention import create_block_mask

    documents = document_starts(position_ids).cumsum(dim=-1)

    def same_document_causal(b, h, query, key):
        return (documents[b, query] == documents[b, key]) & (query >= key)

    length = position_ids.shape[-1]
    return create_block_mask(same_document_causal, position_ids.shape[0], None, length, length,
                             device=position_ids.device)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents,
                     dropout: float) -> torch.Tensor:
    """Causal attention within each document: FlexAttention given a block mask (CUDA), causal SDPA per document
    given their lengths (elsewhere: FlexAttention has no CPU backward)."""
    if not isinstance(documents, list):
        return _compiled_flex()(q, k, v, block_mask=documents)
    rows = []
    for row, lengths in enumerate(documents):
        pieces = [F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, dropout_p=dropout)
                  for qd, kd, vd in zip(*(t[row:row + 1].split(lengths, dim=2) for t in (q, k, v)))]
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows, dim=0)


_FLEX = None


def _compiled_flex():
    global _FLEX
    if _FLEX is None:  # compiled once, on first use: uncompiled FlexAttention would hold every score
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.width % config.heads:
            raise ValueError(f"width {config.width} is not a multiple of heads {config.heads}")
        self.heads, self.dropout = config.heads, config.dropout
        self.c_attn = nn.Linear(config.width, 3 * config.width, bias=config.bias)  # query, key, value at once
        self.c_proj = nn.Linear(config.width, config.width, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, documents: Documents | None, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        if documents is not None:
            y = packed_attention(q, k, v, documents, dropout)
            return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(batch, length, width)))
        causal, mask = True, None
        if cache is not None:
            past = cache.seen_by(layer)
            k, v = cache.extend(layer, k, v)
            if past:  # new queries see every cached key and the new ones up to themselves
                causal = False
                mask = torch.ones(length, past + length, dtype=torch.bool, device=x.device).tril(past)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(batch, length, width)))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.width, 4 * config.width, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.width, config.width, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))  # GPT-2's gelu_new


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.width, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, documents: Documents | None, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), documents, cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, gradient_checkpointing: bool = False):
        super().__init__()
        self.config = config
        self.gradient_checkpointing = gradient_checkpointing
        self.wte = nn.Embedding(config.vocab_size, config.width)
        self.wpe = nn.Embedding(config.context, config.width)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width, bias=config.bias)
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix embeds tokens and scores them
        self.apply(self._init_weights)
        for name, parameter in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith("c_proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def fsdp_blocks(self) -> list[nn.Module]:
        return list(self.h)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None, document_lengths: list[list[int]] | None = None) -> torch.Tensor:
        """`document_lengths`: each row's documents, read on the host before the copy (data/batch.py); without
        them a CPU forward reads them from `position_ids` itself."""
        length = input_ids.shape[1]
        start = cache.seen if cache is not None else 0
        documents = None if cache is not None else self._documents(position_ids, document_lengths)
        if position_ids is None:  # one document a row: plain causal attention (the fast kernels)
            position_ids = torch.arange(start, start + length, device=input_ids.device).unsqueeze(0)
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for layer, block in enumerate(self.h):
            if self.gradient_checkpointing and self.training and cache is None:
                x = checkpoint(block, x, documents, use_reentrant=False)
            else:
                x = block(x, documents, cache, layer)
        return self.lm_head(self.ln_f(x))

    @staticmethod
    def _documents(position_ids: torch.Tensor | None, lengths: list[list[int]] | None) -> Documents | None:
        """How attention keeps documents apart: None where every row is one document (plain causal attention);
        on CUDA a FlexAttention block mask, made on the device (no sync); elsewhere each row's document
        lengths."""
        if position_ids is None:
            return None
        if position_ids.device.type == "cuda":
            return document_block_mask(position_ids)
        lengths = lengths if lengths is not None else document_lengths(position_ids)
        return None if all(len(row) == 1 for row in lengths) else lengths

    def new_cache(self) -> KVCache:
        return KVCache(len(self.h))


def gpt(data_spec, layers: int = 4, heads: int = 4, width: int = 128, context: int | None = None,
        dropout: float = 0.0, bias: bool = True, gradient_checkpointing: bool = False) -> GPT:
    """The built-in decoder for text data: the vocabulary from the data, the context from its sequences."""
    if data_spec.num_classes is None:
        raise ValueError("gpt is a language model: train it on text (`trainwise prepare CORPUS`), whose "
                         "vocabulary gives its output size")
    context = context or int(data_spec.input_shape[0])
    return GPT(GPTConfig(vocab_size=data_spec.num_classes, context=context, layers=layers, heads=heads,
                         width=width, dropout=dropout, bias=bias), gradient_checkpointing=gradient_checkpointing)
