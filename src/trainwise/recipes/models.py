"""Built-in models: a small CNN for images and an MLP for tables.

Both are plain nn.Modules built from a DataSpec. `gradient_checkpointing=True` recomputes each block's
activations during backward (torch.utils.checkpoint, use_reentrant=False). No batch norm: accumulated
micro-batches then give exactly the gradients of one large batch.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainwise.data.bundle import DataSpec


class CheckpointedSequential(nn.Module):
    """Blocks run in order; with checkpointing on, each block's activations are recomputed in backward."""

    def __init__(self, blocks: Sequence[nn.Module], head: nn.Module, gradient_checkpointing: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = head
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


def cnn(data_spec: DataSpec, channels: Sequence[int] = (32, 64), hidden: int = 128, dropout: float = 0.1,
        pooled_size: int = 4, gradient_checkpointing: bool = False) -> CheckpointedSequential:
    """Conv blocks (3×3 conv, ReLU, 2× downsampling after the first), pooled to a fixed grid, then an MLP head."""
    if len(data_spec.input_shape) != 3:
        raise ValueError(f"the cnn model needs images shaped (channels, height, width), "
                         f"the data gives {data_spec.input_shape}; use model.name=mlp for tables")
    in_channels = data_spec.input_shape[0]
    blocks: list[nn.Module] = []
    for i, out_channels in enumerate(channels):
        layers: list[nn.Module] = [nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU()]
        if i == 0 and min(data_spec.input_shape[1:]) > 2 * pooled_size:
            layers.append(nn.MaxPool2d(2))
        blocks.append(nn.Sequential(*layers))
        in_channels = out_channels
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(pooled_size), nn.Flatten(),
        nn.Linear(in_channels * pooled_size * pooled_size, hidden), nn.ReLU(), nn.Dropout(dropout),
        nn.Linear(hidden, _outputs(data_spec)),
    )
    return CheckpointedSequential(blocks, head, gradient_checkpointing)


def mlp(data_spec: DataSpec, hidden: Sequence[int] = (64, 32), dropout: float = 0.1,
        gradient_checkpointing: bool = False) -> CheckpointedSequential:
    """Linear → ReLU → Dropout blocks, then a linear head."""
    width = math.prod(data_spec.input_shape)
    blocks: list[nn.Module] = [nn.Flatten()] if len(data_spec.input_shape) > 1 else []
    for size in hidden:
        blocks.append(nn.Sequential(nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)))
        width = size
    return CheckpointedSequential(blocks, nn.Linear(width, _outputs(data_spec)), gradient_checkpointing)


def _outputs(spec: DataSpec) -> int:
    return spec.num_classes if spec.task == "classification" and spec.num_classes else 1


from trainwise.recsys.models import din, gru4rec, popularity, sasrec  # noqa: E402  recommenders (data.name=shop)

from trainwise.text.gpt import gpt  # noqa: E402  the built-in language model

BUILTIN_MODELS = {"cnn": cnn, "mlp": mlp, "sasrec": sasrec, "gru4rec": gru4rec, "popularity": popularity, "din": din,
                  "gpt": gpt}
