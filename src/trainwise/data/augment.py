"""Training-time augmentations a DataBundle applies to each batch on the device (`DataBundle.augment`)."""
from __future__ import annotations

import torch


def random_shift(images: torch.Tensor, max_shift: int = 1) -> torch.Tensor:
    """Shift each image by up to `max_shift` pixels in each direction, filling with zeros."""
    n, _, h, w = images.shape
    padded = torch.nn.functional.pad(images, (max_shift,) * 4)
    dy = torch.randint(0, 2 * max_shift + 1, (n, 1, 1), device=images.device)
    dx = torch.randint(0, 2 * max_shift + 1, (n, 1, 1), device=images.device)
    rows = torch.arange(h, device=images.device).view(1, h, 1) + dy
    cols = torch.arange(w, device=images.device).view(1, 1, w) + dx
    batch = torch.arange(n, device=images.device).view(n, 1, 1)
    shifted = padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()
    # with one channel `contiguous()` keeps the permuted strides (a size-1 dimension's stride is free), and a
    # convolution reads those as channels-last: its weight gradients came out channels-last too, unlike the
    # weights, and DDP warned "Grad strides do not match bucket view strides" on every rank. Same memory,
    # standard strides.
    return shifted.view(-1).view(shifted.shape)


def feature_noise(features: torch.Tensor, std: float = 0.05) -> torch.Tensor:
    """Gaussian noise on standardised features."""
    return features + std * torch.randn_like(features)
