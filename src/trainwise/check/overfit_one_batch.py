"""The overfit-one-batch probe: a few dozen training steps on one batch must cut its loss sharply.

Any working model, loss and optimizer can memorise a single batch. If the loss does not fall, the wiring is
broken: an output detached from the graph, a loss that does not depend on the labels, a learning rate of
zero, frozen parameters. The probe runs the engine's own training step (train/step/train_step.py: the same loss,
autocast, clipping and optimizer as `trainwise train`) on the caller's model itself, and copies only what can
train (for adapters on a frozen base, a few MB), to tell whether any weight moved.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainwise.findings import Finding

if TYPE_CHECKING:
    from trainwise.train.step.train_step import TrainStep

PROBE_STEPS = 40  # "a few dozen": enough for Adam at a usual LR to memorise 32 rows, and well under a second
# Sharp: the loss must end below this share of its start. A wired model memorising one batch drops far
# more (to a few percent). Above it, with weights that do move, the model learns slowly (a low LR: at
# 1e-4 Adam moves each weight at most 4e-3 in 40 steps) or the loss does not follow the labels: a warning.
# Broken, an error: the step fails, the loss is not finite, or not one weight changed (LR 0, frozen
# parameters, an optimizer holding other parameters).
SHARP_KEPT = 0.5
# A frozen base with adapters (LoRA) trains a few low-rank matrices, one of them starting at zero: at the LRs
# fine-tuning uses (1e-4..2e-4) it cannot memorise a batch in a few dozen steps however well it is wired (a
# rank-4 LoRA MLP at 2e-4 kept 98% of its loss, at 1e-3 82%, at 1e-2 8%). The probe checks the wiring, not the
# LR, so it trains adapters at least this fast, and says so in the evidence and the message.
ADAPTER_PROBE_LR = 1e-2
# A base initialised at random (model.hf_config, a built-in model) and frozen: its output layer's logits span a
# fraction of a nat (weights of std 0.02 after a fixed norm), so no adapter can make a token likely; a higher
# rank does not help (a tiny Llama's rank-4 LoRA kept 93% of its loss at LR 1e-2, its full fine-tune 36%;
# initialised wider, as a trained model's head is, the same LoRA kept 7%).
RANDOM_BASE = ("Only the adapters train, on a base initialised at random (not trained): its frozen output layer "
               "can barely tell tokens apart, whatever the adapters do, so a higher rank will not help. Unless "
               "that is the cause, the data may be too hard to memorise, ")
RANDOM_BASE_FIX = "Fine-tune a trained model (model.hf=DIR), or train every weight (model.method=full)."
MAX_PROBE_S = 30.0  # the probe's time bound: at most this, and at most PROBE_SHARE of the planned run
PROBE_SHARE = 0.1
MIN_PROBE_S = 5.0
MIN_STEPS = 8  # fewer steps than this in the time bound: too short to judge, said so (not a warning)

CHECKS = ("Check the model's forward returns its output without `.detach()`, `.item()` or `torch.no_grad()`.",
          "Check the learning rate (optim.lr) is not zero or tiny, and that parameters have requires_grad.",
          "Check the loss compares the outputs with the batch's own labels (the same order and shape).")


def probe_budget_s(first_step_s: float, planned_steps: int | None) -> float:
    """Seconds the probe may take: 10% of the planned run (its steps at the probe's pace), at most 30 s; a
    probe of a few seconds is never cut (a short run of a small model loses nothing to it)."""
    if not planned_steps:
        return MAX_PROBE_S
    return max(MIN_PROBE_S, min(MAX_PROBE_S, PROBE_SHARE * first_step_s * planned_steps))


def overfit_one_batch(model: nn.Module, inputs: torch.Tensor | dict[str, torch.Tensor],
                      targets: torch.Tensor | None, *,
                      optimizer: torch.optim.Optimizer, loss_fn, precision: str = "fp32",
                      device: torch.device | None = None, grad_clip_norm: float | None = 1.0,
                      steps: int = PROBE_STEPS, model_name: str | None = None,
                      planned_steps: int | None = None, random_base: bool = False) -> Finding:
    """The probe on a step assembled from these parts as every step is (TrainStep.from_settings); a run's
    check builds its step from the run's config instead (`probe_step`)."""
    from trainwise.train.step.train_step import StepSettings, TrainStep

    device = device or torch.device("cpu")
    model.to(device)
    settings = StepSettings(precision=precision, grad_clip_norm=grad_clip_norm, model_name=model_name)  # type: ignore[arg-type]
    step = TrainStep.from_settings(model, optimizer, settings, device=device, loss_fn=loss_fn)
    return probe_step(step, inputs, targets, steps=steps, planned_steps=planned_steps, random_base=random_base)


def probe_step(step: "TrainStep", inputs: torch.Tensor | dict[str, torch.Tensor], targets: torch.Tensor | None,
               *, steps: int = PROBE_STEPS, planned_steps: int | None = None, random_base: bool = False,
               before: dict[str, torch.Tensor] | None = None) -> Finding:
    """Train `step`'s model on one batch for `steps` steps; an info finding when the loss falls sharply, a
    warning when it falls slowly, an error when it does not fall or the step fails. `inputs` may be a token
    batch (a dict, `targets` None). The probe stops early when its time is up (`probe_budget_s` of a run of
    `planned_steps` micro-batch steps), and says it was too short to judge when fewer than MIN_STEPS fit.
    `random_base`: the frozen base under the adapters was initialised at random, not trained (said if it fails).
    `before`: the trainable weights as they were (`trainable_snapshot`), when the caller keeps a copy already."""
    model, optimizer, device = step.model, step.optimizer, step.device
    model.train()
    run_lr = optimizer.param_groups[0]["lr"]
    adapters = any(not p.requires_grad for p in model.parameters())
    if adapters:  # the probe's own optimizer: the run's is built afresh
        for group in optimizer.param_groups:
            group["lr"] = max(group["lr"], ADAPTER_PROBE_LR) if group["lr"] > 0 else 0.0
    batch = [inputs] if isinstance(inputs, dict) else [(inputs, targets)]
    rows = len(inputs["input_ids"]) if isinstance(inputs, dict) else len(inputs)
    # what can move: the weights the optimizer trains (a frozen base cannot, and a copy of it is the model's
    # size again: 500 MiB for a 135M-parameter base under a few MB of adapters)
    before = trainable_snapshot(model) if before is None else before
    started = time.perf_counter()
    losses: list[float] = []
    norms: list[float] = []
    try:
        budget = _train_steps(step, batch, steps, planned_steps, losses, norms, device)
    except RuntimeError as error:  # a detached output: "element 0 of tensors does not require grad"
        return Finding(
            "overfit_probe_failed", "error", "the training step fails on one batch",
            f"The model's training step raised: {_first_line(error)}. Nothing can learn until it runs.",
            {"error": _first_line(error), "steps_done": len(losses), "rows": rows}, CHECKS)
    elapsed = time.perf_counter() - started
    if len(losses) < MIN_STEPS:
        return Finding("overfit_probe_skipped", "info", f"one-batch probe cut short after {len(losses)} steps",
                       f"A step on one micro-batch of {rows} rows took {elapsed / len(losses):.2g} s; the probe may "
                       f"take {budget:.0f} s (10% of the planned run, at most {MAX_PROBE_S:.0f} s), too few steps to "
                       "judge whether the model learns. The run's own loss curve will show it.",
                       {"steps": len(losses), "rows": rows, "seconds": elapsed, "budget_s": budget})
    moved = _largest_change(model, before)
    return _verdict(losses, norms, moved, rows=rows, lr=optimizer.param_groups[0]["lr"], seconds=elapsed,
                    run_lr=run_lr, adapters=adapters, random_base=adapters and random_base)


def trainable_snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the parameters that can train (requires_grad), by name: all a few steps can change."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def _largest_change(model: nn.Module, before: dict[str, torch.Tensor]) -> float:
    """The largest absolute change of any weight since `before`, one tensor at a time (no copy of the model)."""
    with torch.no_grad():
        changes = [float((p - before[name]).abs().max()) for name, p in model.named_parameters()
                   if name in before and p.numel()]
    return max(changes, default=0.0)


def _train_steps(step, batch, steps: int, planned_steps: int | None, losses: list[float], norms: list[float],
                 device: torch.device) -> float:
    """Run the probe's steps, recording each loss and gradient norm, until `steps` or the time bound; the
    bound in seconds."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # one batch of a few dozen rows: extra threads cost more in hand-offs than they save, and on a
        # busy machine (other jobs on the cores) they made each step 10× slower
        torch.set_num_threads(1)
    started, budget = time.perf_counter(), MAX_PROBE_S
    try:
        for _ in range(steps):
            outcome = step(batch)
            losses.append(float(outcome.loss))
            norms.append(float(outcome.grad_norm))
            elapsed = time.perf_counter() - started
            if len(losses) == 1:
                budget = probe_budget_s(elapsed, planned_steps)
            if elapsed > budget:
                break
    finally:
        torch.set_num_threads(threads)
    return budget


def _verdict(losses: list[float], norms: list[float], moved: float, *, rows: int, lr: float,
             seconds: float, run_lr: float, adapters: bool, random_base: bool = False) -> Finding:
    steps = len(losses)
    first, last = losses[0], min(losses[-3:])
    kept = last / first if first > 0 and math.isfinite(first) else float("nan")
    evidence = {"steps": steps, "rows": rows, "first_loss": first, "last_loss": last, "share_kept": kept,
                "first_grad_norm": norms[0], "last_grad_norm": norms[-1], "largest_weight_change": moved,
                "lr": lr, "run_lr": run_lr, "frozen_base": adapters, "seconds": seconds,
                "rule": f"loss below {SHARP_KEPT:.0%} of its start after {steps} steps"}
    if first == 0:  # not a failure to learn: there is nothing to learn (one class and one output, say)
        return _nothing_to_learn(rows, evidence)
    if not math.isfinite(last) or not math.isfinite(kept) or moved == 0:
        why = (f"the loss became {last}" if not math.isfinite(last) or not math.isfinite(kept) else
               "the gradient norm is 0: no gradient reaches the weights" if norms[0] == 0 else
               f"not one weight changed (LR {lr:.3g})")
        return Finding("overfit_probe_failed", "error", f"the model cannot overfit one batch: {why}",
                       f"{steps} steps on one batch of {rows} rows should drive its loss near zero, but {why}; "
                       f"the loss went from {first:.4g} to {last:.4g}. The model, loss or optimizer wiring is broken.",
                       evidence, CHECKS)
    if kept > SHARP_KEPT:
        return Finding("overfit_probe_slow", "warn", f"one batch is not memorised: loss still {kept:.0%} of its start",
                       f"After {steps} steps on one batch the loss went from {first:.4g} to {last:.4g} only (LR "
                       f"{lr:.3g}); a wired model at a working LR drives it near zero. "
                       + (RANDOM_BASE if random_base else
                          "Only the adapters train (the base is frozen): the rank (model.lora.rank) or the layers "
                          "they wrap (model.lora.target_modules) may be too few, " if adapters else
                          "The LR may be too low, ") + "or the loss may not follow the labels.", evidence,
                       (RANDOM_BASE_FIX if random_base else
                        "Raise optim.lr, or find it: `trainwise lr-find RECIPE --out lr-find`.", *CHECKS))
    return Finding("overfit_probe", "info", f"overfits one batch: loss {first:.3g} → {last:.3g} in {steps} steps",
                   "The model, loss and optimizer are wired: gradients reach the weights and the loss follows the "
                   "labels." + (f" Only the adapters train (the base is frozen); the probe trained them at LR "
                                f"{lr:.3g}, the run at {run_lr:.3g}." if adapters else ""), evidence)


def _nothing_to_learn(rows: int, evidence: dict) -> Finding:
    return Finding("overfit_probe_nothing_to_learn", "error", "the loss is 0 from the first step: nothing to learn",
                   f"On one batch of {rows} rows the loss is exactly 0 before any training, so no gradient can move "
                   "the weights and the model learns nothing. Usually every label is the same class and the model "
                   "has one output per class (one), or the loss does not depend on the labels.", evidence,
                   ("Check the labels hold at least two classes, and that the model has one output per class "
                    "(`trainwise prepare` refuses a table with one).", CHECKS[2]))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
