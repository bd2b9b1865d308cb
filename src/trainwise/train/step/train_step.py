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

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainwise.data.batch import (MicroBatch, chunked_token_loss_sum, document_lengths, flattened_for_varlen,
                                  is_token_batch, label_tokens, model_inputs, token_loss_sum)
from trainwise.errors import ConfigError, ModelCallError, TrainwiseError
from trainwise.llm.loss import head_and_softcap, last_hidden_state
from trainwise.runtime.token_batches import call_model
from trainwise.runtime.precision import Precision, autocast

if TYPE_CHECKING:
    from trainwise.config import RunConfig

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # a MicroBatch's is in data/batch.py
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
        return _mean_squared_error
    cross_entropy = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    return lambda outputs, targets: cross_entropy(outputs.float(), targets)


def label_count(micro_batches: Sequence[Mapping[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    """The step's tokens that carry loss, over every micro-batch and every rank: counted where the labels are
    (host memory: no device work), moved without waiting, summed over the ranks by a collective (no host sync)."""
    count = label_tokens(micro_batches).to(device, non_blocking=True).float()
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(count)
    return count


def _mean_squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """MSE of one output per sample against one target per sample ([N], [N, 1] alike: never broadcast to
    [N, N]). A model with several outputs per sample is refused: regression needs one (shapes are known on
    the host, so the check costs no device sync)."""
    predicted, wanted = outputs.reshape(len(outputs), -1), targets.reshape(len(targets), -1)
    if predicted.shape != wanted.shape:
        raise ConfigError(f"regression (float targets) needs one output per target: the model gives "
                          f"{predicted.shape[1]} per sample, the data {wanted.shape[1]}. For classes, give integer "
                          "targets (or pass data_spec=DataSpec(..., task='classification') to the Trainer); for "
                          "regression, end the model with one output.")
    return nn.functional.mse_loss(predicted.float(), wanted.float())


def model_loss(model: nn.Module, loss_fn: LossFn) -> LossFn:
    """The model's own training loss when it brings one (`model.training_loss(outputs, targets)`, not None:
    e.g. a recommender's sampled softmax, whose training outputs are states scored against a few sampled
    items, recsys/sampled.py), else `loss_fn`. Evaluation keeps `loss_fn` on the model's eval outputs."""
    own = getattr(model, "training_loss", None)
    return own if callable(own) else loss_fn


def dense_gradient_parameters(parameters: Sequence[nn.Parameter], model: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradients are measured and clipped: all but embedding tables with sparse
    gradients (SparseAdam updates them, train/step/optim.py). torch has no norm of a sparse gradient; their rows'
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


class TokenLossModel(nn.Module):
    """A causal LM whose forward returns a token batch's summed loss, the output head and cross-entropy run
    `chunk_size` tokens at a time (data/batch.py), so the logits never exist whole. The engine wraps this module
    (DDP, torch.compile) in place of the model, and under FSDP2 it runs the sharded model: the model's own forward
    computes the hidden states (llm/loss.py), so DDP reduces the head's gradients and FSDP gathers its weights
    like every other layer's. Without labels it returns the model's outputs (logits)."""

    def __init__(self, model: nn.Module, chunk_size: int):
        super().__init__()
        head_and_softcap(model)  # a model without its hidden states apart is refused at build, not at step 1
        self.model, self.chunk_size = model, chunk_size

    def forward(self, labels: torch.Tensor | None = None, **inputs: torch.Tensor) -> torch.Tensor:
        if labels is None:
            return self.model(**inputs)
        head, softcap = head_and_softcap(self.model)
        return chunked_token_loss_sum(last_hidden_state(self.model, **inputs), head, labels, self.chunk_size, softcap)


def training_module(model: nn.Module, loss_chunk_size: int | None) -> nn.Module:
    """What a step's forward runs (and the Trainer wraps for DDP/FSDP/compile): the model, or with
    `loss_chunk_size` its TokenLossModel."""
    return TokenLossModel(model, loss_chunk_size) if loss_chunk_size else model


def uses_varlen_attention(model: nn.Module) -> bool:
    """Whether the model runs FlashAttention, whose variable-length kernel takes packed rows flattened."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    return implementation.startswith("flash_attention")


def takes_document_lengths(model: nn.Module, device: torch.device) -> bool:
    """Whether the model attends per document from lengths read on the host (the built-in gpt off CUDA)."""
    import inspect

    return device.type != "cuda" and "document_lengths" in inspect.signature(model.forward).parameters


class TrainStep:
    """`step(micro_batches)` = forward/backward of each micro-batch (gradients accumulate), then one update.

    `forward` is what computes outputs (the model, its DDP wrapper or its compiled form); `no_sync` gives
    the context that skips DDP's all-reduce on all but the last micro-batch; `to_device` moves a micro-batch
    just before its forward, so only one micro-batch at a time occupies the device.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, loss_fn: LossFn,
                 precision: Precision, device: torch.device, grad_clip_norm: float | None = None,
                 scaler: torch.amp.GradScaler | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                 forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 no_sync: Callable[[], object] | None = None,
                 to_device: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 augment: Callable[[torch.Tensor], torch.Tensor] | None = None, model_name: str | None = None,
                 loss_chunk_size: int | None = None):
        self.model, self.optimizer, self.loss_fn = model, optimizer, model_loss(model, loss_fn)
        self.precision, self.device = precision, device
        self.grad_clip_norm = grad_clip_norm
        self.scheduler = scheduler
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler(device.type, enabled=False)
        self.loss_chunk_size = loss_chunk_size  # token batches: model.loss_chunk_size
        self.loss_model = training_module(model, loss_chunk_size)  # the unwrapped forward (local steps)
        # a step trains: every module in training mode (dropout, recomputation) whatever mode the model was
        # built in. transformers' from_pretrained returns it in eval mode and peft's wrapper in training mode, so
        # without this the blocks ran without their checkpointing until a validation pass, which restores the
        # wrapper's mode to every module, switched it on mid-run (every later step 40-50% slower)
        self.loss_model.train()
        self.forward = forward if forward is not None else self.loss_model
        self.varlen = uses_varlen_attention(model)
        self.host_documents = takes_document_lengths(model, device)
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
        caller reduces them (the guarded steps of train/recovery/oom.py)."""
        if micro_batches and is_token_batch(micro_batches[0]):
            return self.accumulate_tokens(micro_batches, local=local)  # type: ignore[arg-type]
        loss = torch.zeros((), device=self.device)
        for index, (inputs, targets) in enumerate(micro_batches):
            loss += self.forward_backward(inputs, targets, of=len(micro_batches),
                                          last=index == len(micro_batches) - 1, local=local)
        return loss

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, *, of: int, last: bool,
                         local: bool = False) -> torch.Tensor:
        """Add one micro-batch's gradients; its share (one of `of` micro-batches) of the step's loss, detached.
        The step is as many micro-batches as it is given: their count comes with each call (the Trainer's
        TrainState owns the micro-batch size, so an out-of-memory recovery changes it in one place)."""
        inputs, targets = self.to_device(inputs), self.to_device(targets)
        if self.augment is not None:
            inputs = self.augment(inputs)
        forward = self.model if local else self.forward
        # DDP all-reduces gradients during backward; only the last micro-batch of a step needs it
        with self.no_sync() if self.no_sync is not None and not (last or local) else nullcontext():
            with autocast(self.precision, self.device):  # the loss too, as torch.amp recommends
                outputs = self._call("the forward", forward, inputs)
                loss = self._call("the loss", self.loss_fn, outputs, targets, inputs=inputs)
                loss = loss / of
                del outputs  # held by the graph as needed; this name must not keep it past backward
            self.scaler.scale(loss).backward()
        return loss.detach()

    def accumulate_tokens(self, micro_batches: Sequence[Mapping[str, torch.Tensor]], *,
                          local: bool = False) -> torch.Tensor:
        """Token batches: the loss is the sum of every token's cross-entropy over all micro-batches and ranks,
        divided once by their count of label tokens; so micro-batches (and ranks) with fewer real tokens
        weigh less, and accumulation gives the gradient of one big batch. Each rank scales by the world size
        because DDP and FSDP average the ranks' gradients. Returns the step's mean token loss (averaged over
        the ranks by the log record, it is the job's)."""
        world = torch.distributed.get_world_size() if torch.distributed.is_available() and \
            torch.distributed.is_initialized() else 1
        scale = world / label_count(micro_batches, self.device).clamp(min=1)
        loss = torch.zeros((), device=self.device)
        forward = self.loss_model if local else self.forward
        for index, batch in enumerate(micro_batches):
            if self.varlen:  # documents laid end to end, their boundaries read on the host
                batch = flattened_for_varlen(batch)
            elif self.host_documents and "position_ids" in batch and "document_lengths" not in batch:
                batch = {**batch, "document_lengths": document_lengths(batch["position_ids"])}
            batch = {key: self.to_device(value) if isinstance(value, torch.Tensor) else value
                     for key, value in batch.items()}
            last = index == len(micro_batches) - 1
            with self.no_sync() if self.no_sync is not None and not (last or local) else nullcontext():
                with autocast(self.precision, self.device):
                    total = self._call("the forward", self._token_loss, forward, batch,
                                       inputs=batch["input_ids"]) * scale
                self.scaler.scale(total).backward()
            loss += total.detach()
        return loss

    def _token_loss(self, forward: Callable, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One micro-batch's summed token loss; with model.loss_chunk_size `forward` is a TokenLossModel
        (wrapped as the Trainer wraps it) that returns the loss itself, the logits never whole."""
        if self.loss_chunk_size:
            return forward(labels=batch["labels"], **model_inputs(batch))
        return token_loss_sum(call_model(forward, batch), batch["labels"])

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
    def from_settings(cls, model: nn.Module, optimizer: torch.optim.Optimizer, settings: "StepSettings", *,
                      device: torch.device, loss_fn: LossFn | None = None, **wiring) -> "TrainStep":
        """The one assembly of a step from its parts, wherever a step runs: the loss (`default_loss` of the
        task unless `loss_fn`), the scaler the precision needs on this device, clipping, chunked token loss.
        `wiring`: scheduler, forward, no_sync, augment (the Trainer's), to_device (the planner's)."""
        from trainwise.runtime.precision import make_scaler

        return cls(model, optimizer, loss_fn=loss_fn or default_loss(settings.task, settings.label_smoothing),
                   precision=settings.precision, device=device, grad_clip_norm=settings.grad_clip_norm,
                   scaler=make_scaler(settings.precision, device), model_name=settings.model_name,
                   loss_chunk_size=settings.loss_chunk_size, **wiring)

    @classmethod
    def from_config(cls, model: nn.Module, config: "RunConfig", *, task: str, device: torch.device,
                    precision: Precision, loss_fn: LossFn | None = None,
                    optimizer: torch.optim.Optimizer | None = None, **wiring) -> "TrainStep":
        """The step `config` describes (the Trainer, the overfit probe, lr-find, data bench's model rate): its
        optimizer (train/step/optim.py, unless one built elsewhere is given) and StepSettings.of(config)."""
        from trainwise.train.step.optim import build_optimizer

        optimizer = optimizer if optimizer is not None else build_optimizer(model, config.optim)
        return cls.from_settings(model, optimizer, StepSettings.of(config, task=task, precision=precision),
                                 device=device, loss_fn=loss_fn, **wiring)


@dataclass(frozen=True)
class StepSettings:
    """What shapes a step besides its model and optimizer. A run's come from its config (`of`); the planner,
    which traces steps of jobs that have no run config yet, gives its own (plan/traced_step.py TrainingStep)."""

    precision: Precision = "fp32"
    task: str = "classification"
    """Picks the default loss: cross-entropy for classification, MSE for regression."""
    grad_clip_norm: float | None = None
    label_smoothing: float = 0.0
    loss_chunk_size: int | None = None
    """Token batches: the head and cross-entropy run this many tokens at a time (llm/loss.py)."""
    model_name: str | None = None
    """How messages name the user's model (its class name when not given)."""

    @classmethod
    def of(cls, config: "RunConfig", *, task: str, precision: Precision) -> "StepSettings":
        return cls(precision=precision, task=task, grad_clip_norm=config.train.grad_clip_norm,
                   label_smoothing=config.train.label_smoothing, loss_chunk_size=config.model.loss_chunk_size,
                   model_name=config.model.factory or config.model.name)
