"""The optimizer a config names. Weight decay applies to weight matrices and kernels only: decaying biases
and normalisation gains hurts more than it regularises."""
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
        return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum)
    cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
    return cls(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps)
