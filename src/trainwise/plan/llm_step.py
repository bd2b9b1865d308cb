"""The training step of a language-model job, as the planner traces it: the model built on the meta device
from a config (catalogue name, config.json or model directory), its method applied (full, freeze, LoRA via
peft, QLoRA's 4-bit base), checkpointing enabled as `trainwise train` enables it, dict batches of the batch
contract, the engine's TrainStep with its token loss (chunked when asked).

`lm_step(job, layers=k)` builds the same job with only k transformer blocks: llm_estimate.py traces two
depths and extends the line to the real one (every block is the same shape, so memory, FLOPs and traffic are linear in
the number of blocks), which is what keeps a 70B plan to seconds.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from trainwise.llm import hf, methods
from trainwise.plan.llm_job import LmJob
from trainwise.plan.traced_step import DeviceKind, TrainingStep

NF4_BLOCK, ABSMAX_BLOCK = 64, 256  # bitsandbytes NF4: one absmax per 64 weights, double-quantised per 256


def build_lm(job: LmJob, layers: int | None = None, device: str | torch.device | None = None) -> nn.Module:
    """The job's model with its method and checkpointing applied, on `device` (None: torch's default device;
    the trace builds it under `torch.device("meta")`)."""
    model = hf.build_model(job.config(layers), device=device, dtype=job.dtype)
    if job.method == "qlora":  # planned by size: the adapters on a stand-in 4-bit base (see Planned4bitLinear)
        model = methods.apply_method(model, "lora", lora=job.lora)
        quantise_base_for_plan(model, hf.torch_dtype(job.dtype))
    else:
        model = methods.apply_method(model, job.method, trainable_blocks=job.trainable_blocks, lora=job.lora)
    if job.gradient_checkpointing:
        methods.enable_gradient_checkpointing(model)
    return model.train()


def lm_step(job: LmJob, layers: int | None = None, micro_batch: int | None = None, seq_len: int | None = None,
            device_kind: DeviceKind = "cuda") -> TrainingStep:
    """The TrainingStep trace_step runs for `job` (with `layers` blocks, at `micro_batch` x `seq_len`). Every
    traced size keeps the job's accumulation, as TrainingStep.at_micro_batch does: the sizes then differ only
    in what one micro-batch holds, so their slopes are the cost of a sequence."""
    config = job.config(layers)
    micro = micro_batch or job.micro
    return TrainingStep(
        build_model=lambda: build_lm(job, layers), input_shape=(seq_len or job.seq_len,),
        input_dtype=torch.int64, task="classification", num_classes=config.vocab_size, micro_batch_size=micro,
        accumulation_steps=max(job.batch_size // job.micro, 1), precision=job.precision, optimizer=job.optimizer,
        optimizer_args={"lr": 1e-4}, grad_clip_norm=job.grad_clip_norm, device_kind=device_kind,
        vocabulary_size=config.vocab_size, target_shape=(seq_len or job.seq_len,), token_batches=True,
        build_on_meta=True, loss_chunk_size=job.loss_chunk_size)  # the engine's TokenLossModel, traced


# ---- QLoRA's base, planned by size ----------------------------------------------------------------------

class _Dequantised(torch.autograd.Function):
    """y = x @ dequantise(W).T with W frozen, as bitsandbytes' 4-bit matmul runs it: the dequantised weight is
    a temporary of forward, made again in backward for the input's gradient; only the packed weight is kept."""

    @staticmethod
    def forward(ctx, x, packed, out_features, in_features, dtype):
        ctx.shape, ctx.dtype = (out_features, in_features), dtype
        ctx.save_for_backward(packed)
        weight = torch.empty(out_features, in_features, dtype=dtype, device=x.device)
        return nn.functional.linear(x.to(dtype), weight)

    @staticmethod
    def backward(ctx, grad):
        weight = torch.empty(ctx.shape, dtype=ctx.dtype, device=grad.device)
        return grad @ weight, None, None, None, None


class Planned4bitLinear(nn.Module):
    """The memory of bitsandbytes' NF4 Linear4bit with double quantisation: 4-bit weights packed two per byte,
    an 8-bit absmax per 64 weights and an fp32 one per 256 of those. Plans only (it computes nothing real)."""

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features, self.compute_dtype = linear.in_features, linear.out_features, compute_dtype
        n = linear.in_features * linear.out_features
        device = linear.weight.device
        self.weight = nn.Parameter(torch.empty(math.ceil(n / 2), 1, dtype=torch.uint8, device=device),
                                   requires_grad=False)
        self.register_buffer("absmax", torch.empty(math.ceil(n / NF4_BLOCK), dtype=torch.uint8, device=device))
        self.register_buffer("absmax2", torch.empty(math.ceil(n / NF4_BLOCK / ABSMAX_BLOCK), device=device))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Dequantised.apply(x, self.weight, self.out_features, self.in_features, self.compute_dtype)
        return out + self.bias if self.bias is not None else out


def quantise_base_for_plan(model: nn.Module, compute_dtype: torch.dtype = torch.bfloat16) -> None:
    """Every Linear but the output head (inside peft's LoRA layers: their base) becomes a Planned4bitLinear
    computing in `compute_dtype` (the dtype of the model's other weights)."""
    head = methods.output_head(model)
    for path, parent in list(model.named_modules()):
        if "lora_" in path:  # the adapters themselves stay as they are
            continue
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child is not head and not name.startswith("lora_"):
                setattr(parent, name, Planned4bitLinear(child, compute_dtype))
