"""What the planner cannot measure exactly on the CPU is bounded from above, and the plan says so (issue 26: a
keyword-spotting net over raw waveforms was under-estimated).

The kernel at fault: oneDNN's gemm-based convolution backward takes one sample's im2col columns per thread,
so the weight gradient of a stem convolution with one input channel over 16,000 samples needs 1.3 MiB per
thread in fp32. A probe run with fewer threads than the training run missed it.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import trainwise.data.loader as loader
from benchmarks.plan_accuracy import KeywordSpotter   # the held-out model of benchmarks/plan_accuracy.py
from trainwise.plan.memory import trace_step
from trainwise.plan.traced_step import TrainingStep
from trainwise.plan.probe import measured_peak_bytes

aten = torch.ops.aten


def kws_step(precision: str) -> TrainingStep:
    return TrainingStep(build_model=KeywordSpotter, input_shape=(1, 16000), num_classes=12, micro_batch_size=16,
                        precision=precision, optimizer_args={"lr": 1e-3})


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_keyword_spotter_is_not_underestimated(precision):
    step = kws_step(precision)
    torch.manual_seed(0)
    planned, measured = trace_step(step).peak_bytes, measured_peak_bytes(step, torch.device("cpu"))
    assert planned >= measured * 0.95, f"planned {planned} vs measured {measured}"


def stem_backward(batch=8, length=16000):
    """The stem convolution's backward as the trace meets it: (func, args, out) on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        inputs, weight = torch.empty(batch, 1, length), torch.empty(32, 1, 80)
        grad_out = torch.empty(batch, 32, (length - 80) // 4 + 1)
        args = (grad_out, inputs, weight, [32], [4], [0], [1], False, [0], 1, [False, True, True])
        out = aten.convolution_backward.default(*args)
    return aten.convolution_backward.default, args, out


def test_per_thread_buffers_are_measured_for_every_usable_core(monkeypatch):
    """The planning process runs torch on one thread, the training run may use 16 cores: the probe measures
    the kernel with 16 threads, where oneDNN takes the stem's columns once per thread (with 8 or fewer, once)."""
    from trainwise.plan.kernel_bounds import per_thread_columns_workspace
    from trainwise.plan.workspaces import KernelProbe

    func, args, out = stem_backward()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        monkeypatch.setattr(loader, "usable_cores", lambda: 16)
        sixteen = KernelProbe()(func, args, {}, out).workspace
        assert torch.get_num_threads() == 1  # the probe gives the thread count back
    finally:
        torch.set_num_threads(before)
    one_sample = per_thread_columns_workspace(func, args, out, 1)   # one sample's columns, fp32
    assert sixteen >= 16 * one_sample, (sixteen, one_sample)


def test_an_op_too_large_to_run_is_bounded_above_what_it_takes(monkeypatch):
    """copies_bound (an op the probe cannot run) covers the stem's per-thread columns at 16 threads."""
    from trainwise.plan.workspaces import KernelProbe, copies_bound

    monkeypatch.setattr(loader, "usable_cores", lambda: 16)
    func, args, out = stem_backward(batch=16)
    bound = copies_bound(func, args, {}, out)
    before = torch.get_num_threads()
    torch.set_num_threads(16)   # what a 16-core machine runs it with
    try:
        real = KernelProbe()(func, args, {}, out).workspace
    finally:
        torch.set_num_threads(before)
    assert bound >= real > 16 * 2**20


def test_the_plan_says_what_it_bounded(monkeypatch):
    from trainwise.plan.planner import cpu_workspace_notes

    trace = SimpleNamespace(bounded_ops=("aten.convolution_backward.default",))
    estimate = SimpleNamespace(memory={"cpu": SimpleNamespace(traces=(trace,))})
    monkeypatch.setattr(loader, "usable_cores", lambda: torch.get_num_threads() + 2)
    notes = cpu_workspace_notes(estimate)
    assert any("convolution_backward.default could not be measured" in note and "upper bound" in note
               for note in notes)
    assert any(f"{torch.get_num_threads() + 2} threads" in note for note in notes)
    monkeypatch.setattr(loader, "usable_cores", lambda: 1)
    quiet = SimpleNamespace(memory={"cpu": SimpleNamespace(traces=(SimpleNamespace(bounded_ops=()),))})
    assert cpu_workspace_notes(quiet) == []
