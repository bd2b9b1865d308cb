"""The built-in `gpt`: a decoder-only transformer small enough to read on one screen.

GPT-2's layout (learned positions, pre-norm blocks, GELU MLP 4x wide, a final LayerNorm, the output head
tied to the token embedding), so `trainwise export` maps it onto transformers' GPT2LMHeadModel one tensor
for one tensor (evaluate/export.py). Attention is `scaled_dot_product_attention`. Given `position_ids` that
restart at 0 inside a row (packed documents, text/packing.py), attention is block-diagonal: a token sees
only the earlier tokens of its own document, so a packed row computes each document exactly as if alone.

`model(input_ids=..., position_ids=..., attention_mask=...)` returns logits [B, T, vocab]; generation
passes a `KVCache` to reuse the keys and values of the tokens already seen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


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


def document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool: True where query t may attend to key s (same document, s <= t). A document starts
    where its position id is 0; computed on the device, no host sync."""
    document = (position_ids == 0).cumsum(dim=1)
    same = document.unsqueeze(2) == document.unsqueeze(1)
    length = position_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal).unsqueeze(1)


def attention_mask_4d(position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                      length: int) -> torch.Tensor | None:
    """The [B, 1, T, T] bool mask for packed documents (from position ids) and padding (a [B, T] attention
    mask: no query attends to a padded key, but each to itself, so no row is empty); None when plain causal
    attention is all that is needed."""
    mask = document_mask(position_ids) if position_ids is not None else None
    if attention_mask is None:
        return mask
    device = attention_mask.device
    if mask is None:
        mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
    keys = attention_mask.bool()[:, None, None, :]
    return mask & (keys | torch.eye(length, dtype=torch.bool, device=device))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.width % config.heads:
            raise ValueError(f"width {config.width} is not a multiple of heads {config.heads}")
        self.heads, self.dropout = config.heads, config.dropout
        self.c_attn = nn.Linear(config.width, 3 * config.width, bias=config.bias)  # query, key, value at once
        self.c_proj = nn.Linear(config.width, config.width, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        causal = mask is None
        if cache is not None:
            past = cache.seen_by(layer)
            k, v = cache.extend(layer, k, v)
            if past:  # new queries see every cached key and the new ones up to themselves
                causal = False
                mask = torch.ones(length, past + length, dtype=torch.bool, device=x.device).tril(past)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, layer)
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
                attention_mask: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        length = input_ids.shape[1]
        start = cache.seen if cache is not None else 0
        mask = None if cache is not None else attention_mask_4d(position_ids, attention_mask, length)
        if position_ids is None:  # one document a row: plain causal attention (the fast kernels)
            position_ids = torch.arange(start, start + length, device=input_ids.device).unsqueeze(0)
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for layer, block in enumerate(self.h):
            if self.gradient_checkpointing and self.training and cache is None:
                x = checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask, cache, layer)
        return self.lm_head(self.ln_f(x))

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
