"""Mixed precision: which dtype a run computes in, its autocast context, and fp16's gradient scaler."""
from __future__ import annotations

import contextlib
from typing import Literal

import torch

from trainwise.errors import ConfigError

Precision = Literal["fp32", "bf16", "fp16"]
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(name: str, device: torch.device) -> Precision:
    """`auto` → bf16 where the device computes it natively, fp16 on older CUDA cards, fp32 otherwise."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
        return "fp32"  # CPU autocast is slower than fp32 for small models; MPS autocast is young
    if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        name_of_card = torch.cuda.get_device_name(device)
        raise ConfigError(f"train.precision: {name_of_card} has no native bf16 (it needs compute capability "
                          "8.0, Ampere or newer); use train.precision=fp16 or auto.")
    return name  # type: ignore[return-value]


def autocast(precision: Precision, device: torch.device):
    """The autocast context of a precision; fp32 gets a no-op context."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def make_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    """fp16 needs loss scaling to keep small gradients from flushing to zero; other precisions get a
    disabled scaler so the loop is the same for all."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def enable_tf32(device: torch.device, allowed: bool) -> bool:
    """TF32 matmuls and convolutions on Ampere and newer (about 8× fp32 throughput, 10-bit mantissa)."""
    if device.type != "cuda" or not allowed:
        return False
    if torch.cuda.get_device_capability(device)[0] < 8:
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True
