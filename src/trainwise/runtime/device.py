"""Which device a run uses: CUDA when present, then Apple's MPS, then the CPU; `train.device` overrides."""
from __future__ import annotations

import torch

from trainwise.errors import ConfigError


def resolve_device(name: str = "auto", local_rank: int | None = None) -> torch.device:
    """`local_rank` is set under torchrun: each rank then trains on the card of its LOCAL_RANK, never all
    on card 0, whether the config says auto, cuda or cuda:0."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank if local_rank is not None else torch.cuda.current_device())
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device: {name!r} is not a device; use auto, cpu, cuda, cuda:N or mps.") from None
    if device.type == "cuda" and local_rank is not None:
        if device.index not in (None, 0, local_rank):
            raise ConfigError(f"train.device: {name!r} under torchrun, where each rank uses the card of its "
                              "LOCAL_RANK; use train.device=cuda, and CUDA_VISIBLE_DEVICES to choose the cards.")
        device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device: {name!r} asked for CUDA, but this torch sees no CUDA device "
                              f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}). "
                              "Run `trainwise doctor` to see why, or use train.device=auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"train.device: {name!r} does not exist; this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s): cuda:0..cuda:{torch.cuda.device_count() - 1}.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("train.device: mps is not available on this machine; use train.device=auto.")
    return device
