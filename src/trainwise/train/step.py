"""One training step, defined once.

The Trainer runs it; the planner traces it on fake tensors (plan/memory.py); the probe times it and
measures its peak (plan/probe.py). So what `trainwise plan` predicts is what `trainwise train` runs: the
same loss, autocast, loss scaling, accumulation, clipping and optimizer.

A step never waits for the device. Everything it reports — the loss, the gradient norm, whether the update
was skipped — stays a device tensor; the Trainer reads them at log steps only. A step whose gradients are
not finite is skipped *on the device*: the fused optimizers take a `found_inf` flag and leave parameters and
moments untouched when it is set (torch.amp.GradScaler uses the same mechanism for fp16), so a NaN never
reaches the weights and no `if torch.isfinite(...)` forces a sync.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainwise.errors import ModelCallError, TrainwiseError
from trainwise.runtime.precision import Precision, autocast

if TYPE_CHECKING:
    from trainwise.config import RunConfig

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MicroBatch = tuple[torch.Tensor, torch.Tensor]
STEP_RANGE = "trainwise.train_step"


@dataclass(frozen=True)
class StepOutcome:
    """Device tensors, read only at log steps."""

    loss: torch.Tensor  # mean loss over the step's micro-batches (unscaled)
    grad_norm: torch.Tensor  # total gradient norm before clipping
    skipped: torch.Tensor  # 1.0 when the update was not applied (non-finite gradients), else 0.0


def default_loss(task: str, label_smoothing: float = 0.0) -> LossFn:
    """Cross-entropy for classification (in fp32 even under autocast), MSE for regression."""
    if task == "regression":
        return lambda outputs, targets: nn.functional.mse_loss(outputs.squeeze(-1).float(), targets.float())
    cross_entropy = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    return lambda outputs, targets: cross_entropy(outputs.float(), targets)


def model_loss(model: nn.Module, loss_fn: LossFn) -> LossFn:
    """The model's own training loss when it brings one (`model.training_loss(outputs, targets)`, not None:
    e.g. a recommender's sampled softmax, whose training outputs are states scored against a few sampled
    items, recsys/sampled.py), else `loss_fn`. Evaluation keeps `loss_fn` on the model's eval outputs."""
    own = getattr(model, "training_loss", None)
    return own if callable(own) else loss_fn


def dense_gradient_parameters(parameters: Sequence[nn.Parameter], model: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradients are measured and clipped: all but embedding tables with sparse
    gradients (SparseAdam updates them, train/optim.py). torch has no norm of a sparse gradient; their rows'
    gradients come from the same loss as the dense ones, so a non-finite step shows in the dense norm."""
    sparse = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}
    return [p for p in parameters if id(p) not in sparse]


def supports_device_skip(optimizer: torch.optim.Optimizer) -> bool:
    """Fused optimizers accept `found_inf` and skip on the device; others need the host to decide."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def total_norm(parameters: Sequence[nn.Parameter]) -> torch.Tensor:
    grads = [p.grad for p in parameters if p.grad is not None]
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6: one foreach kernel
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def replicated(norm: torch.Tensor) -> torch.Tensor:
    """The norm as a plain tensor on every rank: under FSDP it is a DTensor (a collective, not a host sync),
    and the loop's records and the optimizer's skip flag are plain tensors."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class TrainStep:
    """`step(micro_batches)` = forward/backward of each micro-batch (gradients accumulate), then one update.

    `forward` is what computes outputs (the model, its DDP wrapper or its compiled form); `no_sync` gives
    the context that skips DDP's all-reduce on all but the last micro-batch; `to_device` moves a micro-batch
    just before its forward, so only one micro-batch at a time occupies the device.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, loss_fn: LossFn,
                 precision: Precision, device: torch.device, accumulation_steps: int,
                 grad_clip_norm: float | None = None, scaler: torch.amp.GradScaler | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 no_sync: Callable[[], object] | None = None,
                 to_device: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None, model_name: str | None = None):
        self.model, self.optimizer, self.loss_fn = model, optimizer, model_loss(model, loss_fn)
        self.precision, self.device = precision, device
        self.accumulation_steps = accumulation_steps
        self.grad_clip_norm = grad_clip_norm
        self.scheduler = scheduler
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler(device.type, enabled=False)
        self.forward = forward if forward is not None else model
        self.no_sync = no_sync
        self.to_device = to_device or (lambda t: t.to(device, non_blocking=True))
        self.augment = augment
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.clipped = dense_gradient_parameters(self.parameters, model)
        self.device_skip = supports_device_skip(optimizer)
        self.model_name = model_name or type(model).__name__  # for messages about the user's model
        self.steps_done = 0

    def __call__(self, micro_batches: Sequence[MicroBatch]) -> StepOutcome:
        # a named range in torch.profiler traces (and the window the planner's benchmark measures)
        with torch.profiler.record_function(STEP_RANGE):
            return self.update(self.accumulate(micro_batches))

    def accumulate(self, micro_batches: Sequence[MicroBatch], *, local: bool = False) -> torch.Tensor:
        """Forward/backward of every micro-batch (gradients add up); the step's loss, detached.
        `local`: through the plain model, so no DDP hook runs and the gradients stay on this rank until the
        caller reduces them (the guarded steps of train/recovery.py)."""
        loss = torch.zeros((), device=self.device)
        for index, (inputs, targets) in enumerate(micro_batches):
            loss += self.forward_backward(inputs, targets, last=index == len(micro_batches) - 1, local=local)
        return loss

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, *, last: bool,
                         local: bool = False) -> torch.Tensor:
        """Add one micro-batch's gradients; its share of the step's loss, detached."""
        inputs, targets = self.to_device(inputs), self.to_device(targets)
        if self.augment is not None:
            inputs = self.augment(inputs)
        forward = self.model if local else self.forward
        # DDP all-reduces gradients during backward; only the last micro-batch of a step needs it
        with self.no_sync() if self.no_sync is not None and not (last or local) else nullcontext():
            with autocast(self.precision, self.device):  # the loss too, as torch.amp recommends
                outputs = self._call("the forward", forward, inputs)
                loss = self._call("the loss", self.loss_fn, outputs, targets, inputs=inputs)
                loss = loss / self.accumulation_steps
                del outputs  # held by the graph as needed; this name must not keep it past backward
            self.scaler.scale(loss).backward()
        return loss.detach()

    def _call(self, what: str, function: Callable, *args, inputs: torch.Tensor | None = None):
        """Call the model or the loss; what they raise on a real batch is reported as the user's to fix,
        except running out of memory, which the Trainer may recover from."""
        try:
            return function(*args)
        except (torch.OutOfMemoryError, TrainwiseError):
            raise
        except Exception as error:  # a Python try costs nothing until something is raised
            raise ModelCallError.during(what, self.model_name, self.steps_done + 1,
                                        args[0] if inputs is None else inputs, error,
                                        outputs=args[0] if inputs is not None else None) from error

    def update(self, loss: torch.Tensor) -> StepOutcome:
        """Clip, step (or skip on the device when gradients are not finite), advance the learning-rate
        schedule, free the gradients."""
        self.scaler.unscale_(self.optimizer)  # clip and report the true gradient norm
        if self.grad_clip_norm:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.clipped, self.grad_clip_norm)
        else:
            grad_norm = total_norm(self.clipped)
        grad_norm = replicated(grad_norm)
        skipped = (~torch.isfinite(grad_norm)).float()
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # the scaler hands its own found_inf to a fused optimizer
            self.scaler.update()
        elif self.device_skip:
            self.optimizer.found_inf = skipped  # type: ignore[attr-defined]
            self.optimizer.grad_scale = None  # type: ignore[attr-defined]
            self.optimizer.step()
            del self.optimizer.found_inf, self.optimizer.grad_scale  # type: ignore[attr-defined]
        elif not bool(skipped):  # an optimizer without a fused kernel: the host must decide (a sync)
            self.optimizer.step()
        self.steps_done += 1
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # free the gradients before the next forward
        return StepOutcome(loss=loss, grad_norm=grad_norm.detach(), skipped=skipped)

    @classmethod
    def from_config(cls, model: nn.Module, config: "RunConfig", *, task: str, device: torch.device,
                    precision: Precision, accumulation_steps: int, loss_fn: LossFn | None = None,
                    **wiring) -> "TrainStep":
        """The step `config` describes, built by the same factories wherever a step runs (the Trainer, lr-find,
        data bench's model rate): its optimizer (train/optim.py), its loss (`default_loss` of the task unless
        `loss_fn`), its scaler, its clipping. `wiring` is the Trainer's: scheduler, forward, no_sync, augment."""
        from trainwise.runtime.precision import make_scaler
        from trainwise.train.optim import build_optimizer

        return cls(model, build_optimizer(model, config.optim),
                   loss_fn=loss_fn or default_loss(task, config.train.label_smoothing), precision=precision,
                   device=device, accumulation_steps=accumulation_steps, grad_clip_norm=config.train.grad_clip_norm,
                   scaler=make_scaler(precision, device), model_name=config.model.factory or config.model.name,
                   **wiring)
