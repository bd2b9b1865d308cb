"""Mixed precision: which dtype a run computes in, its autocast context, and fp16's gradient scaler."""
from __future__ import annotations

import contextlib
from typing import Literal

import torch

from trainwise.errors import ConfigError

Precision = Literal["fp32", "bf16", "fp16"]
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def choose_precision(requested: str, device_kind: str, *, bf16_native: bool,
                     device_name: str = "this GPU") -> Precision:
    """What a run computes in: the one rule, applied by the trainer to the live device and by the planner to
    the card it plans for. `auto` → bf16 where the device computes it natively, fp16 on older CUDA cards,
    fp32 elsewhere. `bf16_native`: the CUDA card has bf16 units (compute capability 8.0, Ampere, or newer)."""
    if requested == "auto":
        if device_kind == "cuda":
            return "bf16" if bf16_native else "fp16"
        return "fp32"  # CPU autocast is slower than fp32 for small models; MPS autocast is young
    if requested == "bf16" and device_kind == "cuda" and not bf16_native:
        raise ConfigError(f"train.precision: {device_name} has no native bf16 (it needs compute capability "
                          "8.0, Ampere or newer); use train.precision=fp16 or auto.")
    return requested  # type: ignore[return-value]


def resolve_precision(name: str, device: torch.device) -> Precision:
    """`choose_precision` over the facts of `device`."""
    if device.type != "cuda":
        return choose_precision(name, device.type, bf16_native=False)
    return choose_precision(name, "cuda", bf16_native=torch.cuda.is_bf16_supported(including_emulation=False),
                            device_name=torch.cuda.get_device_name(device))


def resolve_weight_dtype(name: str, device: torch.device) -> Literal["fp32", "bf16"]:
    """model.dtype `auto`: bf16 weights where `auto` precision computes in bf16 (a CUDA card with bf16 units),
    fp32 elsewhere. On the CPU (fp32 compute) a bf16 base was never faster: a LoRA step of a 4-layer, 576-wide
    Llama took 1.0-1.6x an fp32 base's time on a shared Xeon that has bf16 units (two tries, load 8-12), and
    CPUs without them emulate bf16; fp32 also keeps the base's outputs exact. An fp16 card has no bf16 units."""
    if name != "auto":
        return name  # type: ignore[return-value]
    return "bf16" if resolve_precision("auto", device) == "bf16" else "fp32"


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
