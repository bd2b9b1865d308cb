"""The two reference models of the GPU benchmark, in plain PyTorch (no torchvision, no transformers):
ResNet-50 (He et al. 2016, bottleneck blocks 3-4-6-3) and GPT-2 small (Radford et al. 2019, 124M
parameters: 12 layers, width 768, 12 heads, context 1024, vocabulary 50257, tied embeddings)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000, base: int = 64, layers=(3, 4, 6, 3)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, channels = [], base
        for stage, count in enumerate(layers):
            for index in range(count):
                blocks.append(Bottleneck(channels, base * 2**stage, 2 if stage > 0 and index == 0 else 1))
                channels = base * 2**stage * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash attention on CUDA
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Next-token language model; `forward(tokens)` returns logits (b, t, vocabulary)."""

    def __init__(self, vocabulary=50257, context=1024, width=768, layers=12, heads=12):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2
        self.config = dict(vocabulary=vocabulary, context=context, width=width, layers=layers, heads=heads)

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 × parameters (less the position table) + attention (PaLM, Chowdhery et al. 2022,
        appendix B): 6N + 12·layers·width·context."""
        c = self.config
        # the tied token embedding is also the output projection, a real matmul: only positions are free
        n = sum(p.numel() for p in self.parameters()) - self.positions.weight.numel()
        return 6 * n + 12 * c["layers"] * c["width"] * c["context"]


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
