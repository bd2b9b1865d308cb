"""What the steps between two log lines went through, counted on the device.

Every step adds its outcome to a handful of device scalars (a few tiny kernels, no sync). The Trainer
reads them with one transfer at log steps, checkpoints and the end, and decides there: a non-finite loss
outside fp16 stops the run with the step where it first appeared; fp16 loss scaling that keeps skipping
stops it too, instead of "completing" a run that learnt nothing.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainwise.data.batch import MicroBatch
from trainwise.train.step.train_step import StepOutcome

# GradScaler halves its scale on each overflow: 20 skips in a row is a 2**20 drop, far past the few
# skips of the first steps while it settles. By then the gradients overflow at any scale.
FP16_MAX_SKIPS_IN_A_ROW = 20

_SKIPPED, _NONFINITE, _FIRST_STEP, _FIRST_LOSS, _FIRST_NORM, _STREAK, _MAX_STREAK, _BAD_TARGETS = range(8)


@dataclass(frozen=True)
class HealthReading:
    skipped_steps: int  # updates not applied since the run began (fp16 overflow or non-finite gradients)
    nonfinite_steps: int  # steps whose loss or gradient norm was NaN/Inf, since the last reading
    first_nonfinite_step: int | None
    first_nonfinite_loss: float | None
    first_nonfinite_grad_norm: float | None
    longest_skip_streak: int  # most updates skipped in a row since the last reading
    nonfinite_target_steps: int = 0  # steps whose (floating-point) targets held NaN/Inf, since the last reading

    def evidence(self, module: str | None, *, lr: float) -> dict[str, Any]:
        """The `nonfinite` event's evidence: the first bad step's numbers, the module that went first."""
        return {"module": module, "loss": self.first_nonfinite_loss, "grad_norm": self.first_nonfinite_grad_norm,
                "nonfinite_steps": self.nonfinite_steps, "longest_skip_streak": self.longest_skip_streak, "lr": lr}


class StepHealth:
    def __init__(self, device: torch.device, skipped_steps: int = 0):
        self.values = torch.zeros(8, device=device)
        self.values[_SKIPPED] = skipped_steps
        self.values[_FIRST_STEP] = -1

    def record(self, step: int, outcome: StepOutcome, micro_batches: Sequence[MicroBatch] = ()) -> None:
        """Add one step's outcome (and whether its targets were finite, so a NaN regression target is named
        as such); device ops only, or host ops on targets still in host memory: no sync either way."""
        v = self.values
        finite = [torch.isfinite(targets).all() for _, targets in _pairs(micro_batches) if targets.is_floating_point()]
        if finite:  # regression targets (class indices are integers, always finite); targets still on the host
            # give a CPU scalar, which a device op takes as an argument: no copy, no sync
            v[_BAD_TARGETS] += (~torch.stack(finite).all()).to(v.dtype)
        bad = ~(torch.isfinite(outcome.loss) & torch.isfinite(outcome.grad_norm))
        first = bad & (v[_FIRST_STEP] < 0)
        v[_SKIPPED] += outcome.skipped
        v[_NONFINITE] += bad.float()
        v[_FIRST_STEP] = torch.where(first, float(step), v[_FIRST_STEP])
        v[_FIRST_LOSS] = torch.where(first, outcome.loss.float(), v[_FIRST_LOSS])
        v[_FIRST_NORM] = torch.where(first, outcome.grad_norm.float(), v[_FIRST_NORM])
        v[_STREAK] = (v[_STREAK] + outcome.skipped) * outcome.skipped  # +1 while skipping, 0 otherwise
        v[_MAX_STREAK] = torch.maximum(v[_MAX_STREAK], v[_STREAK])

    def read(self) -> HealthReading:
        """One device-to-host transfer; starts a new window for the per-window counts."""
        v = self.values.tolist()
        reading = HealthReading(
            skipped_steps=int(v[_SKIPPED]), nonfinite_steps=int(v[_NONFINITE]),
            first_nonfinite_step=int(v[_FIRST_STEP]) if v[_FIRST_STEP] >= 0 else None,
            first_nonfinite_loss=v[_FIRST_LOSS] if v[_FIRST_STEP] >= 0 else None,
            first_nonfinite_grad_norm=v[_FIRST_NORM] if v[_FIRST_STEP] >= 0 else None,
            longest_skip_streak=int(v[_MAX_STREAK]), nonfinite_target_steps=int(v[_BAD_TARGETS]))
        self.values[_NONFINITE] = 0
        self.values[_BAD_TARGETS] = 0
        self.values[_FIRST_STEP] = -1
        self.values[_MAX_STREAK] = self.values[_STREAK]
        return reading


def health_problem(reading: HealthReading, *, fp16: bool, step: int, loss_scale: float) -> str | None:
    """What must stop the run, in the words the person at the terminal needs; None when all is well."""
    if reading.nonfinite_steps and reading.nonfinite_target_steps:
        return (f"the targets contain NaN or Inf: {reading.nonfinite_target_steps} step(s) up to step {step} had a "
                f"non-finite target, so their loss was NaN (first at step {reading.first_nonfinite_step}); the "
                "weights never took those steps. Drop or fill the rows whose target is missing before training "
                "(`trainwise check` names them: nonfinite_targets).")
    if fp16:  # overflow is expected now and then, never for long
        if reading.longest_skip_streak >= FP16_MAX_SKIPS_IN_A_ROW:
            return (f"fp16 loss scaling skipped {reading.longest_skip_streak} updates in a row (up to step {step}), "
                    f"so the model has stopped learning: the gradients overflow fp16 even at loss scale "
                    f"{loss_scale:.3g}. Lower optim.lr, keep train.grad_clip_norm on, or use train.precision=bf16 "
                    "(Ampere or newer) or fp32.")
        return None
    if reading.nonfinite_steps:
        return (f"non-finite loss or gradients at step {reading.first_nonfinite_step} (loss "
                f"{reading.first_nonfinite_loss:.4g}, grad norm {reading.first_nonfinite_grad_norm:.4g}); "
                f"{reading.nonfinite_steps} step(s) up to step {step} were skipped on the device, so the weights "
                "never took them. Lower optim.lr, check the inputs for NaN/Inf, or keep train.grad_clip_norm on.")
    return None


def _pairs(micro_batches: Sequence[MicroBatch]) -> Sequence[MicroBatch]:
    """(inputs, targets) micro-batches; token batches (dicts) have integer labels, always finite."""
    return [batch for batch in micro_batches if not isinstance(batch, dict)]
