"""The optimizer a config names. Weight decay applies to weight matrices and kernels only: decaying biases
and normalisation gains hurts more than it regularises.

Fused kernels where this torch has them for the parameters' device: one kernel per step instead of one per
tensor, and, what matters more, they take a `found_inf` flag, so a step with non-finite gradients is
skipped on the device without the host looking (see train/step.py)."""
from __future__ import annotations

import torch
from torch import nn

from trainwise.config import OptimConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    groups = parameter_groups(model, optim.weight_decay)
    if optim.name == "sgd":
        return _fused_where_supported(torch.optim.SGD, groups, lr=optim.lr, momentum=optim.momentum)
    cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
    return _fused_where_supported(cls, groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps)


def _fused_where_supported(cls: type[torch.optim.Optimizer], groups: list[dict], **options) -> torch.optim.Optimizer:
    try:
        return cls(groups, fused=True, **options)
    except (RuntimeError, TypeError):  # a device (or a torch) without the fused kernel: the default path
        return cls(groups, **options)
