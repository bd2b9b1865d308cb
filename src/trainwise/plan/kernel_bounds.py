"""Upper bounds of what a CPU kernel allocates inside itself where the probe (workspaces.py) cannot measure
it exactly: the column (im2col) buffers of convolutions, and how many threads a run may use, which decides
every buffer a kernel takes per thread."""
from __future__ import annotations

import contextlib
import math

import torch

aten = torch.ops.aten
LOW_PRECISION = (torch.bfloat16, torch.float16)


def _convolution_operands(func, args, out):
    """(input, weight, output, stride, padding, groups) of a convolution or its backward, else None."""
    if func is aten.convolution.default:
        return args[0], args[1], out, args[3], args[4], args[8]
    if func is aten.convolution_backward.default:
        return args[1], args[2], args[0], args[4], args[5], args[9]
    return None


def _sample_columns(inputs, weight, output, stride, padding, groups) -> int:
    """Elements of one sample's im2col matrix over all groups (input channels × kernel positions × output
    positions); 0 for a pointwise convolution, which needs none."""
    kernel = weight.shape[2:]
    if all(k == 1 for k in kernel) and all(s == 1 for s in stride) and not any(padding):
        return 0
    return inputs.shape[1] * math.prod(kernel) * math.prod(output.shape[2:])


def cpu_im2col_workspace(func, args, out) -> int:
    """Bytes of the im2col buffer of CPU's fallback convolution (aten/src/ATen/native/ConvolutionMM2d.cpp,
    aten::_slow_conv2d), which CPUs without oneDNN bf16/fp16 support run for low-precision convolutions,
    forward and backward: the whole batch's columns. The probe measures it (with the rest of what the
    convolution allocates); this is the bound used when an op is too large to probe."""
    operands = _convolution_operands(func, args, out)
    if operands is None or operands[0].dtype not in LOW_PRECISION or operands[0].dim() not in (3, 4):
        return 0  # Conv1d runs as a 2-D convolution of height 1
    inputs = operands[0]
    return inputs.shape[0] * _sample_columns(*operands) * inputs.element_size()


def per_thread_columns_workspace(func, args, out, threads: int) -> int:
    """Bytes of oneDNN's gemm-based convolution's column buffers: one sample's im2col matrix per thread,
    in fp32 for a low-precision weight gradient. Measured for the weight gradient of a stem convolution
    (1 input channel, kernel 80, 16,000 samples): one buffer up to 8 threads, then one per thread (16 at 16
    threads, whatever the batch), so the bound takes one per thread."""
    operands = _convolution_operands(func, args, out)
    if operands is None:
        return 0
    inputs, groups = operands[0], max(operands[5], 1)
    itemsize = 4 if func is aten.convolution_backward.default else inputs.element_size()
    return threads * _sample_columns(*operands) // groups * itemsize


def probe_threads() -> int:
    """Threads the probe runs kernels with: torch's count, or every usable core when that is more, since a
    run on this machine may use them all and buffers taken per thread grow with the count (an upper bound
    for a run with fewer threads)."""
    from trainwise.data.loader import usable_cores

    return max(torch.get_num_threads(), usable_cores())


@contextlib.contextmanager
def threads(count: int):
    """torch (and oneDNN) run with `count` threads inside the block."""
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count != before:
            torch.set_num_threads(before)
