"""Stand-ins for optimizers the planner cannot run on fake tensors (bitsandbytes needs CUDA and real data):
each allocates exactly the state the real one keeps, in its layout, and updates in place as its fused kernel
does, so the trace counts their memory like any other optimizer's.

- `adamw8bit` — bitsandbytes' AdamW8bit (blockwise 8-bit): two uint8 moments per element plus one fp32
  absmax per 256-element block for each; tensors under 4,096 elements keep fp32 moments
  (bitsandbytes/optim/optimizer.py, `min_8bit_size` and `blocksize`). Its paged variant has the same
  footprint on the card until the driver pages it out under pressure.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

BLOCK = 256  # elements per absmax block of bitsandbytes' blockwise 8-bit optimizers
MIN_8BIT_SIZE = 4096  # smaller tensors keep 32-bit moments


class PlannedAdamW8bit(torch.optim.Optimizer):
    """The memory of bitsandbytes.optim.AdamW8bit (not its arithmetic: it runs on fake tensors only). Like the
    fused kernels, it takes the step's `found_inf` flag instead of asking the host (train/step/train_step.py)."""

    _step_supports_amp_scaling = True

    def __init__(self, params, lr: float = 1e-3):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    if p.numel() >= MIN_8BIT_SIZE:
                        blocks = math.ceil(p.numel() / BLOCK)
                        state.update(state1=torch.zeros_like(p, dtype=torch.uint8),
                                     state2=torch.zeros_like(p, dtype=torch.uint8),
                                     absmax1=torch.zeros(blocks, device=p.device),
                                     absmax2=torch.zeros(blocks, device=p.device))
                    else:
                        state.update(state1=torch.zeros_like(p, dtype=torch.float32),
                                     state2=torch.zeros_like(p, dtype=torch.float32))
                p.add_(p.grad, alpha=-group["lr"])  # one fused in-place kernel: no temporaries
        return None


def _adamw8bit(model: nn.Module, args: dict[str, Any]) -> torch.optim.Optimizer:
    return PlannedAdamW8bit([p for p in model.parameters() if p.requires_grad], lr=args.get("lr", 1e-3))


PLANNED_OPTIMIZERS = {"adamw8bit": _adamw8bit}
