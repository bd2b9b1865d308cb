"""A LoRA model from a user's factory (peft.get_peft_model around a small MLP), as a new user writes one.

The base is initialised from its own seed, apart from the run's RNG: like a base loaded from a model
directory, it is the same every time it is built, so a resume or an evaluation can rebuild it."""
from __future__ import annotations

import torch
from torch import nn


class TwoLayer(nn.Module):
    def __init__(self, width: int, classes: int):
        super().__init__()
        self.body = nn.Linear(width, 32)
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def lora_mlp(data_spec, base_seed: int = 7, rank: int = 4, dropout: float = 0.1, train_head: bool = True):
    from peft import LoraConfig, get_peft_model

    with torch.random.fork_rng():
        torch.manual_seed(base_seed)
        base = TwoLayer(data_spec.input_shape[0], data_spec.num_classes)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout, target_modules=["body"],
                        modules_to_save=["head"] if train_head else None)
    return get_peft_model(base, config)
