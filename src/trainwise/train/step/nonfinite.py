"""When the loss goes non-finite outside fp16: find the first module whose output did."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


@torch.no_grad()
def first_nonfinite_module(model: nn.Module, forward: Callable[[torch.Tensor], object], inputs: torch.Tensor,
                           context: AbstractContextManager = nullcontext()) -> tuple[str, str] | None:
    """Re-run `forward(inputs)` (inside `context`, e.g. autocast) with hooks; the (name, type) of the first
    module (in execution order) whose output holds NaN or Inf, or None when every output is finite."""
    found: list[tuple[str, str]] = []

    def hook(name: str):
        def check(module: nn.Module, inputs, output) -> None:
            if found:
                return
            tensors = output if isinstance(output, (tuple, list)) else (output,)
            if any(isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()
                   for t in tensors):
                found.append((name or "(model)", type(module).__name__))
        return check

    # leaves first: hooks fire when a module finishes, so a leaf reports before the block that holds it
    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()]
    try:
        with context:
            forward(inputs)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def first_nonfinite_in(model: nn.Module, forward: Callable, micro_batch, device: torch.device,
                       context: AbstractContextManager = nullcontext()) -> tuple[str, str] | None:
    """`first_nonfinite_module` on one micro-batch: `(inputs, targets)`, or a token batch whose fields the
    model takes by name."""
    from trainwise.data.batch import is_token_batch
    from trainwise.runtime.token_batches import call_model

    if is_token_batch(micro_batch):
        batch = {key: value.to(device) for key, value in micro_batch.items()}
        return first_nonfinite_module(model, lambda _: call_model(forward, batch), None, context)
    return first_nonfinite_module(model, forward, micro_batch[0].to(device), context)
