"""A LoRA model from a user's factory (peft.get_peft_model around a small MLP), as a new user writes one.

The base is initialised from its own seed, apart from the run's RNG: like a base loaded from a model
directory, it is the same every time it is built, so a resume or an evaluation can rebuild it."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def fsdp_world_of_one() -> Iterator[None]:
    """A process group of one rank (Gloo, an in-process store) around a run in this process, as torchrun gives a
    one-rank job: train.strategy=fsdp then shards the model with fully_shard (its parameters become DTensors)
    and saves through the collectives, cheaply. A run started by train_run leaves the group at its end."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
