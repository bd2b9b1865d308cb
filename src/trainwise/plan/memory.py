"""Peak memory of one training step, traced on fake tensors: no GPU, and no memory for the model.

The model and a batch are built under torch's FakeTensorMode, so every tensor has a shape, a dtype and a
(meta) storage but no data. Two optimizer steps (the second is the steady state: optimizer moments exist,
and with accumulation two micro-batches keep gradients alive across a forward) run under
`AllocationTracker`, a TorchDispatchMode that sees every op's outputs, counts each new storage once and
subtracts it when Python frees it, exactly the lifetimes the real allocator sees. This is the approach of
torch.distributed._tools.mem_tracker.MemTracker; it is re-done here in a few lines so that it works on
every torch we support and so that we control the categories and the device's rounding rule.

What a trace cannot see, accounted for explicitly elsewhere (advise.py): per-device fixed costs (CUDA
context, cuBLAS/cuDNN workspaces), the caching allocator's fragmentation. The 512-byte rounding of the CUDA
caching allocator is applied here, per storage, when tracing for a CUDA card.

Fake CUDA tensors need a CUDA build of torch, so the trace always runs on CPU fake tensors; device
differences are applied by `TrainingStep.device_kind`: rounding, and the optimizer's `foreach` path (the
default on CUDA, whose temporaries are a second copy of the gradient list).
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from trainwise.plan.flops import FlopTally

DeviceKind = Literal["cpu", "cuda"]
Category = Literal["parameters", "gradients", "optimizer_state", "activations", "temporaries"]
CATEGORIES: tuple[Category, ...] = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")

# c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize = 512; every block is a multiple of it.
CUDA_ALLOCATION_ROUNDING = 512


@dataclass(frozen=True)
class TrainingStep:
    """Everything about one training step that decides its memory, independent of where it runs."""

    build_model: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype = torch.float32
    task: Literal["classification", "regression"] = "classification"
    num_classes: int | None = None
    micro_batch_size: int = 32
    accumulation_steps: int = 1
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    optimizer_args: dict[str, Any] = field(default_factory=dict)
    grad_clip_norm: float | None = None
    label_smoothing: float = 0.0
    device_kind: DeviceKind = "cpu"
    # Token models read integer inputs; their embeddings need the index range.
    vocabulary_size: int | None = None

    def at_micro_batch(self, micro_batch_size: int) -> "TrainingStep":
        return replace(self, micro_batch_size=micro_batch_size)

    def on(self, device_kind: DeviceKind) -> "TrainingStep":
        return replace(self, device_kind=device_kind)


@dataclass(frozen=True)
class StepTrace:
    """What one traced training step needs: the peak and its split, bytes, FLOPs and ops."""

    micro_batch_size: int
    peak_bytes: int
    breakdown: dict[str, int]  # category -> bytes live at the peak
    micro_batch_peak_bytes: int  # highest point during forward/backward: grows with the micro-batch
    optimizer_peak_bytes: int  # highest point during clip + optimizer step: independent of it
    parameter_count: int
    parameter_bytes: int
    largest_module_parameter_bytes: int  # FSDP gathers one module's full parameters at a time
    optimizer_state_bytes: int
    micro_batch_flops: int  # forward + backward (+ recompute) of one micro-batch
    flops_by_op: dict[str, int]
    micro_batch_bytes_written: int  # sum of op outputs of one micro-batch: the memory-traffic estimate
    micro_batch_ops: int  # aten ops of one micro-batch: each is at least one kernel launch on a GPU
    optimizer_bytes_written: int  # ... of clipping + the optimizer step + zero_grad
    optimizer_ops: int
    device_kind: DeviceKind
    precision: str


# ---- the step itself: the same code is traced, measured (benchmarks) and probed ------------------------

def make_optimizer(step: TrainingStep, parameters) -> torch.optim.Optimizer:
    args = dict(step.optimizer_args)
    # CUDA tensors take the multi-tensor (foreach) path by default; CPU ones the per-tensor loop
    foreach = step.device_kind == "cuda"
    if step.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=args.get("lr", 1e-3), momentum=args.get("momentum", 0.9),
                               weight_decay=args.get("weight_decay", 0.0), foreach=foreach)
    kind = torch.optim.AdamW if step.optimizer == "adamw" else torch.optim.Adam
    return kind(parameters, lr=args.get("lr", 1e-3), betas=tuple(args.get("betas", (0.9, 0.999))),
                eps=args.get("eps", 1e-8), weight_decay=args.get("weight_decay", 0.0), foreach=foreach)


def make_batch(step: TrainingStep, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    shape = (step.micro_batch_size, *step.input_shape)
    if step.input_dtype.is_floating_point:
        inputs = torch.randn(shape, dtype=step.input_dtype, device=device)
    else:
        inputs = torch.randint(0, step.vocabulary_size or 2, shape, dtype=step.input_dtype, device=device)
    if step.task == "classification":
        targets = torch.randint(0, step.num_classes or 2, (step.micro_batch_size,), device=device)
    else:
        targets = torch.randn(step.micro_batch_size, device=device)
    return inputs, targets


def compute_loss(step: TrainingStep, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if step.task == "classification":
        return nn.functional.cross_entropy(outputs.float(), targets, label_smoothing=step.label_smoothing)
    return nn.functional.mse_loss(outputs.float().reshape(targets.shape), targets.float())


def run_optimizer_step(step: TrainingStep, model: nn.Module, optimizer: torch.optim.Optimizer,
                       batches: list[tuple[torch.Tensor, torch.Tensor]], device_type: str = "cpu") -> None:
    """One optimizer step over micro-batches, as the trainer does it: forward under autocast, backward
    of the scaled loss, clip, step, and zero_grad(set_to_none) so gradients are freed at once."""
    model.train()
    for inputs, targets in batches:
        with _autocast(step.precision, device_type):
            outputs = model(inputs)
        loss = compute_loss(step, outputs, targets) / len(batches)
        loss.backward()
        del outputs, loss
    if step.grad_clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), step.grad_clip_norm,
                                       foreach=step.device_kind == "cuda")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _autocast(precision: str, device_type: str):
    if precision == "fp32":
        return torch.autocast(device_type, enabled=False)
    # traces use CPU autocast; its cast lists follow CUDA's for matmuls and convolutions
    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def warm_and_steady_batches(step: TrainingStep, make: Callable[[], tuple]) -> tuple[list, list]:
    """Step 1 has one micro-batch (it creates the optimizer state); step 2, the steady state, two when
    accumulating, because a second forward then runs with the first micro-batch's gradients alive."""
    return [make()], [make() for _ in range(min(step.accumulation_steps, 2))]


# ---- the tracker -----------------------------------------------------------------------------------------

class _Storage:
    __slots__ = ("nbytes", "category", "born", "died", "__weakref__")

    def __init__(self, nbytes: int, category: str, born: int):
        self.nbytes = nbytes
        self.category = category
        self.born = born
        self.died: int | None = None


class AllocationTracker(TorchDispatchMode):
    """Counts live tensor storages; remembers the peak, and when it was, for each part of the step.

    Every storage keeps its birth and death on an event clock, so the split of the peak is computed at the
    end with the final labels: the optimizer's moments, made as temporaries of its first step, count as
    optimizer state wherever the peak fell."""

    def __init__(self, rounding: int = 1, hidden_workspace: Callable[..., int] | None = None):
        super().__init__()
        self.rounding = rounding
        self.hidden_workspace = hidden_workspace
        self.phase: str = "activations"
        self.in_optimizer = False
        self.total = 0
        self.clock = 0
        self.peak = {"micro_batches": 0, "optimizer": 0}
        self.peak_time = {"micro_batches": 0, "optimizer": 0}
        self.bytes_written = {"micro_batches": 0, "optimizer": 0}
        self.ops = {"micro_batches": 0, "optimizer": 0}
        self._records: dict[int, _Storage] = {}  # id(storage) -> record, while the storage lives
        self._history: list[_Storage] = []

    def enter_optimizer(self) -> None:
        self.phase = "temporaries"
        self.in_optimizer = True

    @property
    def part(self) -> str:
        return "optimizer" if self.in_optimizer else "micro_batches"

    def _size(self, storage: torch.UntypedStorage) -> int:
        nbytes = storage.nbytes()
        return math.ceil(nbytes / self.rounding) * self.rounding if self.rounding > 1 else nbytes

    def track(self, tensor: torch.Tensor, category: str | None = None) -> None:
        """Count a tensor's storage (once); with a category, (re)label it."""
        storage = tensor.untyped_storage()
        key = id(storage)
        record = self._records.get(key)
        if record is None:
            self.clock += 1
            record = _Storage(self._size(storage), category or self.phase, self.clock)
            self._records[key] = record
            self._history.append(record)
            self.total += record.nbytes
            self.bytes_written[self.part] += storage.nbytes()
            weakref.finalize(storage, self._free, key, record)
            self._check_peak()
        elif category is not None:
            record.category = category

    def _check_peak(self) -> None:
        if self.total > self.peak[self.part]:
            self.peak[self.part] = self.total
            self.peak_time[self.part] = self.clock

    def workspace(self, nbytes: int) -> None:
        """A buffer a kernel allocates and frees inside itself, unseen by dispatch: only its peak counts."""
        self.clock += 1
        record = _Storage(nbytes, "temporaries", self.clock)
        self._history.append(record)
        self.total += nbytes
        self._check_peak()
        self.total -= nbytes
        self.clock += 1
        record.died = self.clock

    def _free(self, key: int, record: _Storage) -> None:
        if self._records.get(key) is record:
            del self._records[key]
        self.clock += 1
        record.died = self.clock
        self.total -= record.nbytes

    def live_at(self, time: int) -> dict[str, int]:
        live = {category: 0 for category in CATEGORIES}
        for record in self._history:
            if record.born <= time and (record.died is None or record.died > time):
                live[record.category] += record.nbytes
        return live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "aten":  # fake tensors also route prim.device etc. here; those are no kernels
            self.ops[self.part] += 1
        tree_map_only(torch.Tensor, self.track, out)
        if self.hidden_workspace is not None:
            nbytes = self.hidden_workspace(func, args, out)
            if nbytes:
                self.workspace(nbytes)
        return out


def cpu_im2col_workspace(func, args, out) -> int:
    """Bytes of the im2col buffer of CPU's fallback convolution (aten::_slow_conv2d), which CPUs without
    oneDNN bf16/fp16 support run for low-precision convolutions, forward and backward. A 1×1 convolution
    with stride 1 and no padding needs none."""
    if func is torch.ops.aten.convolution.default:
        inputs, weight, output, stride, padding = args[0], args[1], out, args[3], args[4]
    elif func is torch.ops.aten.convolution_backward.default:
        inputs, weight, output, stride, padding = args[1], args[2], args[0], args[4], args[5]
    else:
        return 0
    if inputs.dtype not in (torch.bfloat16, torch.float16) or inputs.dim() != 4:
        return 0
    kernel_h, kernel_w = weight.shape[2:]
    if (kernel_h, kernel_w) == (1, 1) and tuple(stride) == (1, 1) and not any(padding):
        return 0
    batch, channels = inputs.shape[:2]
    return batch * channels * kernel_h * kernel_w * output.shape[2] * output.shape[3] * inputs.element_size()


def hidden_workspace_for(step: "TrainingStep") -> Callable[..., int] | None:
    """Kernel-internal buffers of the present backend that a trace cannot see (CPU only: on CUDA, cuDNN's
    workspace is a per-device fixed cost, see advise.py)."""
    if step.device_kind != "cpu" or step.precision == "fp32":
        return None
    supported = (torch.ops.mkldnn._is_mkldnn_bf16_supported() if step.precision == "bf16"
                 else torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return None if supported and torch.backends.mkldnn.is_available() else cpu_im2col_workspace


# ---- tracing -----------------------------------------------------------------------------------------------

def trace_step(step: TrainingStep) -> StepTrace:
    """Trace two optimizer steps on fake tensors; the peak over both, split by category."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rounding = CUDA_ALLOCATION_ROUNDING if step.device_kind == "cuda" else 1
    tracker = AllocationTracker(rounding, hidden_workspace_for(step))
    flops = FlopTally()
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        model = _into_mode(step.build_model(), mode)
        parameters = [p for p in model.parameters() if p.requires_grad]
        with tracker:
            for p in model.parameters():
                tracker.track(p, "parameters")
            for b in model.buffers():
                tracker.track(b, "parameters")
            _label_gradients(tracker, parameters)
            optimizer = make_optimizer(step, parameters)
            warm, steady = warm_and_steady_batches(step, lambda: make_batch(step))
            _run_labelled(tracker, step, model, optimizer, warm)
            del warm
            ops_before, written_before = dict(tracker.ops), dict(tracker.bytes_written)
            _run_labelled(tracker, step, model, optimizer, steady)
            micro_batches = len(steady)
            del steady
            state_bytes = sum(value.untyped_storage().nbytes() for state in optimizer.state.values()
                              for value in state.values() if isinstance(value, torch.Tensor))
        # FLOPs in a pass of their own: FlopCounterMode's module hooks keep checkpointed tensors alive
        with flops:
            run_optimizer_step(step, model, optimizer, [make_batch(step)])
    ops = {part: tracker.ops[part] - ops_before[part] for part in ops_before}
    written = {part: tracker.bytes_written[part] - written_before[part] for part in written_before}
    worst = max(tracker.peak, key=tracker.peak.get)
    return StepTrace(
        micro_batch_size=step.micro_batch_size,
        peak_bytes=tracker.peak[worst],
        breakdown=tracker.live_at(tracker.peak_time[worst]),
        micro_batch_peak_bytes=tracker.peak["micro_batches"],
        optimizer_peak_bytes=tracker.peak["optimizer"],
        parameter_count=sum(p.numel() for p in parameters),
        parameter_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        largest_module_parameter_bytes=_largest_module_parameter_bytes(model),
        optimizer_state_bytes=state_bytes,
        micro_batch_flops=flops.total,
        flops_by_op=dict(flops.by_op),
        micro_batch_bytes_written=round(written["micro_batches"] / micro_batches),
        micro_batch_ops=round(ops["micro_batches"] / micro_batches),
        optimizer_bytes_written=written["optimizer"],
        optimizer_ops=ops["optimizer"],
        device_kind=step.device_kind,
        precision=step.precision,
    )


def _into_mode(model: nn.Module, mode) -> nn.Module:
    """Parameters and buffers that are not fake tensors of `mode` (a deepcopy inside the builder, as
    nn.TransformerEncoder does, gives its copies a fake mode of their own) are replaced by ones that are;
    shared tensors stay shared."""
    from torch._subclasses.fake_tensor import FakeTensor

    replaced: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None or (isinstance(tensor, FakeTensor) and tensor.fake_mode is mode):
                    continue
                if id(tensor) not in replaced:
                    fresh = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
                    if isinstance(tensor, nn.Parameter):
                        fresh = nn.Parameter(fresh, requires_grad=tensor.requires_grad)
                    replaced[id(tensor)] = fresh
                table[name] = replaced[id(tensor)]
    return model


def _label_gradients(tracker: AllocationTracker, parameters: list[nn.Parameter]) -> None:
    # a gradient is a temporary of backward until autograd stores it in .grad
    for p in parameters:
        p.register_post_accumulate_grad_hook(lambda param: tracker.track(param.grad, "gradients"))


def _run_labelled(tracker: AllocationTracker, step: TrainingStep, model: nn.Module,
                  optimizer: torch.optim.Optimizer, batches: list) -> None:
    """Forward outputs are activations, everything made in backward and the optimizer temporaries; the
    optimizer's moments are relabelled as optimizer state once it has made them."""
    for inputs, targets in batches:
        tracker.track(inputs, "activations")
        tracker.track(targets, "activations")

    def forward_phase(_module, _args):
        tracker.phase = "activations"

    def backward_phase_after(_module, _args, output):
        # backward of the model starts when the gradient of its output arrives
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: setattr(tracker, "phase", "temporaries"))

    handles = [model.register_forward_pre_hook(forward_phase),
               model.register_forward_hook(backward_phase_after)]
    pre = register_optimizer_step_pre_hook(lambda *_: tracker.enter_optimizer())
    post = register_optimizer_step_post_hook(lambda opt, *_: _label_state(tracker, opt))
    try:
        run_optimizer_step(step, model, optimizer, batches)
    finally:
        for handle in (*handles, pre, post):
            handle.remove()
        tracker.phase = "activations"


def _label_state(tracker: AllocationTracker, optimizer: torch.optim.Optimizer) -> None:
    tracker.in_optimizer = False
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                tracker.track(value, "optimizer_state")


def _largest_module_parameter_bytes(model: nn.Module) -> int:
    """The largest set of parameters one leaf-ish module owns directly (FSDP's unit of gathering)."""
    largest = 0
    for module in model.modules():
        own = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        largest = max(largest, own)
    return largest
