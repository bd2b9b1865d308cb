"""The overfit-one-batch probe: a few dozen training steps on one batch must cut its loss sharply.

Any working model, loss and optimizer can memorise a single batch. If the loss does not fall, the wiring is
broken: an output detached from the graph, a loss that does not depend on the labels, a learning rate of
zero, frozen parameters. The probe runs the engine's own training step (train/step.py: the same loss,
autocast, clipping and optimizer as `trainwise train`), on a copy of nothing: the caller gives it a fresh
model.
"""
from __future__ import annotations

import math
import time

import torch
from torch import nn

from trainwise.diagnose.findings import Finding

PROBE_STEPS = 40  # "a few dozen": enough for Adam at a usual LR to memorise 32 rows, and well under a second
# Sharp: the loss must end below this share of its start. A wired model memorising one batch drops far
# more (to a few percent). Above it, with weights that do move, the model learns slowly (a low LR: at
# 1e-4 Adam moves each weight at most 4e-3 in 40 steps) or the loss does not follow the labels: a warning.
# Broken, an error: the step fails, the loss is not finite, or not one weight changed (LR 0, frozen
# parameters, an optimizer holding other parameters).
SHARP_KEPT = 0.5

CHECKS = ("Check the model's forward returns its output without `.detach()`, `.item()` or `torch.no_grad()`.",
          "Check the learning rate (optim.lr) is not zero or tiny, and that parameters have requires_grad.",
          "Check the loss compares the outputs with the batch's own labels (the same order and shape).")


def overfit_one_batch(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *,
                      optimizer: torch.optim.Optimizer, loss_fn, precision: str = "fp32",
                      device: torch.device | None = None, grad_clip_norm: float | None = 1.0,
                      steps: int = PROBE_STEPS, model_name: str | None = None) -> Finding:
    """Train `model` on one batch for `steps` steps; an info finding when the loss falls sharply, a warning
    when it falls slowly, an error when it does not fall or the step fails."""
    from trainwise.train.step import TrainStep

    device = device or torch.device("cpu")
    model.to(device).train()
    step = TrainStep(model, optimizer, loss_fn=loss_fn, precision=precision, device=device,  # type: ignore[arg-type]
                     accumulation_steps=1, grad_clip_norm=grad_clip_norm, model_name=model_name)
    batch = [(inputs, targets)]
    started = time.perf_counter()
    losses: list[float] = []
    norms: list[float] = []
    before = [p.detach().clone() for p in model.parameters()]
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # one batch of a few dozen rows: extra threads cost more in hand-offs than they save, and on a
        # busy machine (other jobs on the cores) they made each step 10× slower
        torch.set_num_threads(1)
    try:
        for _ in range(steps):
            outcome = step(batch)
            losses.append(float(outcome.loss))
            norms.append(float(outcome.grad_norm))
    except RuntimeError as error:  # a detached output: "element 0 of tensors does not require grad"
        return Finding(
            "overfit_probe_failed", "error", "the training step fails on one batch",
            f"The model's training step raised: {_first_line(error)}. Nothing can learn until it runs.",
            {"error": _first_line(error), "steps_done": len(losses), "rows": len(inputs)}, CHECKS)
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - started
    first, last = losses[0], min(losses[-3:])
    kept = last / first if first > 0 and math.isfinite(first) else float("nan")
    moved = max((float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before) if p.numel()),
                default=0.0)
    evidence = {"steps": steps, "rows": len(inputs), "first_loss": first, "last_loss": last, "share_kept": kept,
                "first_grad_norm": norms[0], "last_grad_norm": norms[-1], "largest_weight_change": moved,
                "lr": optimizer.param_groups[0]["lr"], "seconds": elapsed,
                "rule": f"loss below {SHARP_KEPT:.0%} of its start after {steps} steps"}
    if not math.isfinite(last) or not math.isfinite(kept) or moved == 0:
        why = (f"the loss became {last}" if not math.isfinite(last) or not math.isfinite(kept) else
               "the gradient norm is 0: no gradient reaches the weights" if norms[0] == 0 else
               f"not one weight changed (LR {evidence['lr']:.3g})")
        return Finding("overfit_probe_failed", "error", f"the model cannot overfit one batch: {why}",
                       f"{steps} steps on one batch of {len(inputs)} rows should drive its loss near zero, but {why}; "
                       f"the loss went from {first:.4g} to {last:.4g}. The model, loss or optimizer wiring is broken.",
                       evidence, CHECKS)
    if kept > SHARP_KEPT:
        return Finding("overfit_probe_slow", "warn", f"one batch is not memorised: loss still {kept:.0%} of its start",
                       f"After {steps} steps on one batch the loss went from {first:.4g} to {last:.4g} only (LR "
                       f"{evidence['lr']:.3g}); a wired model at a working LR drives it near zero. The LR may be too "
                       "low, or the loss may not follow the labels.", evidence,
                       ("Raise optim.lr, or find it: `trainwise lr-find RECIPE --out lr-find`.", *CHECKS))
    return Finding("overfit_probe", "info", f"overfits one batch: loss {first:.3g} → {last:.3g} in {steps} steps",
                   "The model, loss and optimizer are wired: gradients reach the weights and the loss follows the "
                   "labels.", evidence)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
