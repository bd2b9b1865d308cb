"""What CPU kernels allocate that a trace on fake tensors cannot see, and how much of it.

A fake tensor has the shape and dtype of what a kernel returns, nothing of what the kernel allocates inside
itself and frees before returning, and sometimes not even the right size or dtype of what it returns. On the
CPU, the allocator counts all of it. Two kinds, two ways of knowing them:

* ATen's own kernels allocate what their source says, the same on every CPU: computed here from the op's
  shapes and dtypes, each rule citing its source file.
* oneDNN's kernels (convolutions and transposed convolutions of every kind, bf16/fp16 matrix products, the
  LSTM) reorder their operands into blocked layouts and take per-thread scratchpads whose size depends on
  the implementation oneDNN picks for this CPU (AVX2, AVX-512, AVX-512 BF16, AMX), on the number of threads
  and on oneDNN's version; the LSTM also returns a training workspace that the fake kernel leaves empty.
  No formula holds across x86 CPUs, so the present one is asked: the kernel runs once, on zero-filled
  tensors of the op's shapes, strides and dtypes, and torch.profiler's allocation events give its internal
  peak and its outputs' real sizes. Results are cached per shape; an op too large to run is run at two
  smaller batches and extrapolated linearly (reorders grow with the batch, scratchpads do not). The flash
  attention's per-thread buffers and the embedding bag's index sorts are asked the same way.

Two things cannot be known exactly, so they are bounded from above, and the plan says so:
* buffers taken per thread grow with the number of threads the run will use. oneDNN's gemm-based
  convolution backward (the weight gradient of a convolution with few input channels, like a stem over a
  raw 16,000-sample waveform) takes one im2col copy of a sample per thread: 1.3 MiB at 2 threads, 20 MiB at
  16, a third of such a step. The probe runs kernels with the most threads this machine offers
  (`probe_threads`), not the fewer the planning process may have.
* an op too large to run here gets `copies_bound`: a reordered copy of every operand, or the column
  buffers of an im2col convolution (whole batch, or one sample per thread), whichever is larger.

Only CPU traces use this: on CUDA, cuBLAS/cuDNN workspaces are per-device fixed costs (advise.py).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from trainwise.plan.kernel_bounds import (LOW_PRECISION, cpu_im2col_workspace, per_thread_columns_workspace,
                                          probe_threads, threads)

aten = torch.ops.aten


@dataclass(frozen=True)
class KernelMemory:
    """What one kernel call really allocates beyond what its fake outputs show."""

    workspace: int = 0  # allocated and freed inside the kernel: counts at the kernel's peak only
    output_bytes: tuple[int | None, ...] = ()  # real bytes of each tensor output (None: as the fake one)
    bounded: bool = False  # the workspace is an upper bound (the kernel could not be run here), not measured


# ---- ATen kernels: from their source --------------------------------------------------------------------

def _tensors(values) -> list[torch.Tensor]:
    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor)]


def _nbytes(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    return tensor.numel() * (dtype or tensor.dtype).itemsize


def promotion_workspace(func, args, kwargs, out) -> int:
    """aten/src/ATen/TensorIterator.cpp (compute_types): on the CPU, a pointwise op whose floating inputs
    differ in dtype copies each input that is not in the common dtype into it before the loop, and an
    in-place op whose output is not in the common dtype computes into a temporary and copies back. Under
    autocast this is every residual `x + attention(x)` of an fp32 stream and a bf16 branch."""
    # pointwise ops take flat arguments: a plain loop, as this runs for every op of a trace
    inputs = [t for t in (*args, *kwargs.values())
              if isinstance(t, torch.Tensor) and t.dim() > 0 and t.is_floating_point()]
    if len(inputs) < 2 or len({t.dtype for t in inputs}) < 2:
        return 0
    common = functools.reduce(torch.promote_types, (t.dtype for t in inputs))
    copies = sum(_nbytes(t, common) for t in {id(t): t for t in inputs}.values() if t.dtype != common)
    results = _tensors(out)
    if func._schema.is_mutable and results and results[0].dtype != common:
        copies += _nbytes(results[0], common)
    return copies


def mean_workspace(args, out) -> int:
    """aten/src/ATen/native/ReduceOps.cpp (mean_out): on the CPU a bf16/fp16 mean sums an fp32 copy of the
    whole input into an fp32 result, then divides and casts that back."""
    source = args[0]
    if source.dtype not in LOW_PRECISION:
        return 0
    return _nbytes(source, torch.float32) + _nbytes(out, torch.float32)


def safe_softmax_workspace(args, out) -> int:
    """aten/src/ATen/native/SoftMax.cpp (_safe_softmax, the math attention's softmax): a bool mask of the
    -inf entries and its all-reduction over `dim`, alive while the rows that are all -inf are zeroed."""
    source, dim = args[0], args[1]
    return source.numel() + source.numel() // max(source.shape[dim], 1) + 4 if source.dim() else 0


def batch_norm_backward_workspace(args, out) -> int:
    """aten/src/ATen/native/Normalization.cpp (batch_norm_backward_cpu_template): grad_input is allocated
    once, then allocated again in the input's contiguous format when input and gradient are contiguous;
    the first one is freed only when the second replaces it."""
    grad_out, source, mask = args[0], args[1], args[-1]
    return _nbytes(source) if mask[0] and _dense_format(source) is not None and (
        _dense_format(source) == _dense_format(grad_out)) else 0


def _dense_format(tensor: torch.Tensor) -> torch.memory_format | None:
    """The memory format a tensor is dense in, as ATen's suggest_memory_format sees it (None: neither)."""
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())
    if last is not None and tensor.is_contiguous(memory_format=last) and not tensor.is_contiguous():
        return last
    return torch.contiguous_format if tensor.is_contiguous() else None


def group_norm_backward_workspace(args, out) -> int:
    """aten/src/ATen/native/cpu/group_norm_kernel.cpp (GroupNormBackwardKernelImpl): per-(sample, channel)
    sums ds and db in the accumulation type, float."""
    batch, channels = args[5], args[6]
    return 2 * batch * channels * 4


ATEN_RULES: dict[Any, Callable[[tuple, Any], int]] = {
    aten.mean.dim: mean_workspace,
    aten.mean.default: mean_workspace,
    aten._safe_softmax.default: safe_softmax_workspace,
    aten.native_batch_norm_backward.default: batch_norm_backward_workspace,
    aten.native_group_norm_backward.default: group_norm_backward_workspace,
}


def fix_output_dtypes(func, args, out):
    """Where the fake kernel returns another dtype than the CPU kernel, return what the CPU returns: the
    next ops (and autograd's casts) then follow the real step. native_group_norm_backward's decomposition
    computes in the promoted dtype (fp32 for a bf16 input and an fp32 gradient); the CPU kernel returns
    grad_input in the input's dtype (aten/src/ATen/native/group_norm.cpp)."""
    if func is aten.native_group_norm_backward.default and out[0] is not None and out[0].dtype != args[1].dtype:
        grad_input = torch.empty_strided(out[0].shape, out[0].stride(), dtype=args[1].dtype, device=out[0].device)
        return (grad_input, *out[1:])
    return out


# ---- oneDNN kernels: asked of the present CPU -------------------------------------------------------------

# Each probed op, with the (argument, dimension) pairs that carry the batch: what is scaled down when the op
# is too large to run as it is. aten/src/ATen/native/mkldnn/{Conv,Matmul,RNN}.cpp hand these to oneDNN;
# aten/src/ATen/native/cpu/FlashAttentionKernel.cpp takes per-thread buffers of its own.
PROBED: dict[Any, tuple[tuple[int, int], ...]] = {
    aten.convolution.default: ((0, 0),),
    aten.convolution_backward.default: ((0, 0), (1, 0)),
    aten.mm.default: ((0, 0),),
    aten.addmm.default: ((1, 0),),
    # in place and into a given output (the chunked loss's backward, llm/loss.py): bf16 products convert
    # through fp32 buffers of their own; no batch dimension to scale
    aten.addmm_.default: (),
    aten.mm.out: (),
    aten.bmm.default: ((0, 0), (1, 0)),
    aten.baddbmm.default: ((1, 0), (2, 0)),
    aten.mkldnn_rnn_layer.default: ((0, 1), (5, 0), (6, 0)),
    aten.mkldnn_rnn_layer_backward.default: ((0, 1), (5, 0), (6, 0), (7, 1), (8, 0), (9, 0), (10, 1), (11, 0),
                                             (12, 0)),
    aten._scaled_dot_product_flash_attention_for_cpu.default: ((0, 0), (1, 0), (2, 0)),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: tuple((i, 0) for i in range(6)),
    # aten/src/ATen/native/EmbeddingBag.cpp: offset2bag and its cumsum, and in backward two sorts of the
    # indices and the gathers that follow them; indices and bags differ in length, so no batch to scale
    aten._embedding_bag.default: (),
    aten._embedding_bag_backward.default: (),
}
# The embedding bag's buffers follow the indices, not the table: probed with a table of one row (plus the
# padding index), its argument (the weight, or num_weights) given here with padding_idx's; the zero indices
# stay valid, and the fake outputs are right for these kernels.
TABLE_ARGUMENT = {aten._embedding_bag.default: (0, 8), aten._embedding_bag_backward.default: (6, 11)}
PROBE_LIMIT_BYTES = 64 * 2**20  # real inputs + outputs of one probe; larger ops run at a smaller batch


class KernelProbe:
    """Runs an op for real once per shape and measures what the CPU allocator gives it (any aten op; the
    trace asks it for those in PROBED)."""

    def __init__(self, limit_bytes: int = PROBE_LIMIT_BYTES):
        self.limit_bytes = limit_bytes
        self._cache: dict[tuple, KernelMemory | None] = {}

    def __call__(self, func, args, kwargs, out) -> KernelMemory | None:
        if torch._C._autograd._profiler_enabled():  # a profiler of the caller's: a second one would end it
            return None
        count = probe_threads()
        key = (func, count, torch.is_grad_enabled(), _signature((args, kwargs)))
        if key not in self._cache:
            with threads(count):
                self._cache[key] = self._measure(func, args, kwargs, out)
        return self._cache[key]

    def _measure(self, func, args, kwargs, out) -> KernelMemory | None:
        batch = _batch_size(func, args)
        scaled = {index for index, _ in PROBED.get(func, ())}
        table = TABLE_ARGUMENT.get(func, (None,))[0]
        fixed = sum(_nbytes(t) for i, a in enumerate(args) if i not in scaled and i != table for t in _tensors(a))
        fixed += sum(_nbytes(t) for t in _tensors(kwargs))
        growing = sum(_nbytes(t) for i in scaled for t in _tensors(args[i])) + sum(map(_nbytes, _tensors(out)))
        if fixed + growing <= self.limit_bytes:
            sizes = [batch]
        elif batch is None or fixed > self.limit_bytes:
            return None
        else:  # two smaller batches, at least 2 and 4 (some kernels take another path for one sample)
            largest = max(4, int((self.limit_bytes - fixed) / growing * batch))
            sizes = [largest // 2, largest]
        measured = []
        for size in sizes:
            result = _run_and_measure(func, args, kwargs, size)
            if result is None:
                return None
            measured.append(result)
        workspace, outputs = measured[-1]
        if len(measured) == 2:  # reorders and outputs grow linearly with the batch, scratchpads do not
            (w0, o0), (n0, n1) = measured[0], sizes

            def at_batch(small: int, large: int) -> int:
                return max(0, round(large + (large - small) * (batch - n1) / (n1 - n0)))

            workspace = at_batch(w0, workspace)
            outputs = tuple(None if a is None else at_batch(a, b) for a, b in zip(o0, outputs))
        fake = [t.untyped_storage().nbytes() if isinstance(t, torch.Tensor) and table is None else None
                for t in tree_flatten(out)[0]]
        return KernelMemory(workspace, tuple(None if r is None or f is None or abs(r - f) <= f // 100 else r
                                             for r, f in zip(outputs, fake)))


def _signature(values) -> tuple:
    leaves, spec = tree_flatten(values)
    return (str(spec), tuple((tuple(v.shape), v.stride(), v.dtype, v.storage_offset()) if isinstance(v, torch.Tensor)
                             else repr(v) for v in leaves))


def _batch_size(func, args) -> int | None:
    if not PROBED.get(func):
        return None
    index, dim = PROBED[func][0]
    tensor = args[index]
    return tensor.shape[dim] if isinstance(tensor, torch.Tensor) and tensor.dim() > dim else None


def _real(fake: torch.Tensor, batch_dim: int | None, batch: int | None) -> torch.Tensor:
    """A zero-filled CPU tensor with the fake one's strides (so oneDNN sees the same layouts), its batch
    dimension set to `batch`."""
    shape = list(fake.shape)
    if batch_dim is not None and batch is not None:
        shape[batch_dim] = batch
    order = sorted(range(fake.dim()), key=lambda d: (fake.stride(d), fake.shape[d]), reverse=True)
    strides, step = [0] * fake.dim(), 1
    for d in reversed(order):
        strides[d] = step if fake.stride(d) != 0 else 0
        step *= shape[d] if fake.stride(d) != 0 else 1
    return torch.zeros(max(step, 1), dtype=fake.dtype).as_strided(shape, strides)


def _run_and_measure(func, args, kwargs, batch: int | None) -> tuple[int, tuple[int | None, ...]] | None:
    """(bytes the kernel allocated and freed inside itself, real bytes of each output) at `batch`."""
    from torch.utils._python_dispatch import _disable_current_modes

    scaled = dict(PROBED.get(func, ())) if batch is not None else {}
    with _disable_current_modes(), torch.autocast("cpu", enabled=False):
        real_args = [(_real(a, scaled.get(i), batch) if isinstance(a, torch.Tensor) else a)
                     for i, a in enumerate(args)]
        real_kwargs = tree_map_only(torch.Tensor, lambda t: _real(t, None, None), kwargs)
        if func in TABLE_ARGUMENT:
            table, padding = TABLE_ARGUMENT[func]
            padding_idx = real_args[padding] if len(real_args) > padding and real_args[padding] is not None else -1
            rows = max(1, padding_idx + 1)
            real_args[table] = real_args[table][:rows] if isinstance(real_args[table], torch.Tensor) else rows
        try:
            if func is aten.mkldnn_rnn_layer_backward.default:
                # the workspace its forward left (a fake one has no bytes): the real one at these shapes
                forward = real_args[:7] + [real_args[13], real_args[20], *real_args[14:18], real_args[19],
                                           real_args[21], True]
                with torch.enable_grad():
                    real_args[22] = aten.mkldnn_rnn_layer.default(*forward)[3]
            peak, result = _allocation_peak(lambda: func(*real_args, **real_kwargs))
        except Exception:  # a profiler already running, an op the real kernel refuses: no measurement
            return None
    # outputs that are inputs (in-place ops) were not allocated by the kernel
    seen = {t.untyped_storage().data_ptr() for t in _tensors((real_args, real_kwargs))}
    outputs = []
    for value in tree_flatten(result)[0]:
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in seen:
            seen.add(value.untyped_storage().data_ptr())
            outputs.append(value.untyped_storage().nbytes())
        else:
            outputs.append(None)
    return max(0, peak - sum(o for o in outputs if o)), tuple(outputs)


def _allocation_peak(run: Callable[[], Any]) -> tuple[int, Any]:
    """Peak bytes the CPU allocator handed out during `run` (torch.profiler's allocation events)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_stderr():  # kineto logs profiler_start/stop to fd 2
        prof.__enter__()
    try:
        result = run()
    finally:
        with quiet_stderr():
            prof.__exit__(None, None, None)
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak, result


@contextlib.contextmanager
def quiet_stderr():
    """Silence fd 2 (kineto logs profiler start/stop lines there: noise in a plan)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


MATMULS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)


def _mkl_matmul(args) -> bool:
    """aten/src/ATen/native/LinearAlgebra.cpp (addmm_impl_cpu_): fp32 products go to MKL's sgemm, which
    packs its operands in buffers of its own, outside c10's allocator; oneDNN takes them only when
    torch.set_float32_matmul_precision allows bf16/tf32 arithmetic."""
    return (all(t.dtype == torch.float32 for t in _tensors(args))
            and torch.get_float32_matmul_precision() == "highest")


def copies_bound(func, args, kwargs, out) -> int:
    """For an op that cannot be run here (its weights alone above the probe's limit, or a profiler of the
    caller's already running): one reordered copy of every operand, the most oneDNN's reorders take, plus
    a convolution's columns (the slow path's whole-batch im2col or gemm convolution's one per thread,
    whichever is larger). Other scratchpads are small beside them; the RNN workspace is not covered."""
    table = TABLE_ARGUMENT.get(func, (None,))[0]
    copies = sum(map(_nbytes, _tensors(([a for i, a in enumerate(args) if i != table], kwargs, out))))
    return copies + max(cpu_im2col_workspace(func, args, out),
                        per_thread_columns_workspace(func, args, out, probe_threads()))


# ---- what a CPU trace adds to each op -----------------------------------------------------------------------

class CpuKernels:
    """(func, args, kwargs, out) -> (out, KernelMemory | None): the outputs as the CPU kernel returns them,
    and what it allocates beyond them."""

    def __init__(self, probe: KernelProbe | None = None):
        self.probe = probe or KernelProbe()

    def __call__(self, func, args, kwargs, out):
        out = fix_output_dtypes(func, args, out)
        if func in MATMULS and _mkl_matmul(args):
            return out, None
        if func in PROBED:
            memory = self.probe(func, args, kwargs, out)
            return out, memory if memory is not None else KernelMemory(copies_bound(func, args, kwargs, out),
                                                                         bounded=True)
        workspace = ATEN_RULES[func](args, out) if func in ATEN_RULES else 0
        if torch.Tag.pointwise in func.tags:
            workspace += promotion_workspace(func, args, kwargs, out)
        return out, KernelMemory(workspace) if workspace else None


@functools.lru_cache(maxsize=1)
def _shared_kernels() -> CpuKernels:
    return CpuKernels()  # one cache of measurements per process: shapes repeat across traced batch sizes


def hidden_workspace_for(step) -> CpuKernels | None:
    """Kernel-internal memory of the present CPU that a trace cannot see (None on CUDA: cuBLAS/cuDNN
    workspaces are per-device fixed costs there, see advise.py)."""
    return _shared_kernels() if step.device_kind == "cpu" else None
