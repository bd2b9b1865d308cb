"""The traced peak of a training step: exact where memory is known by hand, and equal to what the CPU
allocator really reaches (measured with torch.profiler's allocation events)."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from trainwise.plan.kernel_bounds import cpu_im2col_workspace
from trainwise.plan.memory import CUDA_ALLOCATION_ROUNDING, trace_step
from trainwise.plan.probe import measured_peak_bytes
from trainwise.plan.traced_step import TrainingStep
from trainwise.recipes.models import CheckpointedSequential


def linear_stack(widths=(100, 200, 10)):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def parameter_bytes(widths, bytes_per=4):
    return sum((a * b + b) * bytes_per for a, b in zip(widths, widths[1:]))


def step(build, shape=(100,), classes=10, batch=8, **kw):
    return TrainingStep(build_model=build, input_shape=shape, num_classes=classes, micro_batch_size=batch, **kw)


def test_linear_stack_parameters_gradients_and_adam_moments_to_the_byte():
    widths = (100, 200, 10)
    trace = trace_step(step(lambda: linear_stack(widths)))
    params = parameter_bytes(widths)
    assert trace.parameter_bytes == params
    assert trace.parameter_count == params // 4
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a 4-byte `step` counter per tensor (4 tensors)
    assert trace.optimizer_state_bytes == 2 * params + 4 * 4
    assert trace.breakdown["parameters"] == params
    # the peak (the optimizer step) holds all of it, and gradients are exactly one copy of the parameters
    assert trace.breakdown["gradients"] == params
    assert trace.breakdown["optimizer_state"] == 2 * params + 4 * 4
    assert trace.peak_bytes == sum(trace.breakdown.values())


def test_sgd_without_momentum_keeps_no_state_and_adam_costs_two_copies_more():
    widths = (64, 64, 64, 2)
    sgd = trace_step(step(lambda: linear_stack(widths), shape=(64,), classes=2, optimizer="sgd",
                          optimizer_args={"momentum": 0.0}))
    adam = trace_step(step(lambda: linear_stack(widths), shape=(64,), classes=2, optimizer="adam"))
    assert sgd.optimizer_state_bytes == 0
    assert adam.peak_bytes - sgd.peak_bytes >= 2 * parameter_bytes(widths)


def traced_and_measured(precision: str) -> tuple[int, int]:
    """A Linear stack at batch 256 with clipping and accumulation: bf16 products run in oneDNN, whose
    scratchpads (packed copies of the operands, per-thread accumulators) differ from one CPU to another."""
    s = step(lambda: linear_stack((30, 256, 256, 2)), shape=(30,), classes=2, batch=256, precision=precision,
             grad_clip_norm=1.0, accumulation_steps=2)
    return trace_step(s).peak_bytes, measured_peak_bytes(s, torch.device("cpu"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_estimate_equals_the_cpu_allocators_real_peak(precision):
    traced, measured = traced_and_measured(precision)
    assert traced == pytest.approx(measured, rel=0.01)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN ISA caps are x86")
def test_estimate_equals_the_real_peak_on_a_cpu_without_native_bf16():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
           "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])}
    code = ("import json, torch; from tests.plan.test_memory import traced_and_measured; "
            "print(json.dumps([torch.ops.mkldnn._is_mkldnn_bf16_supported(), *traced_and_measured('bf16')]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    native, traced, measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert native is False
    assert traced == pytest.approx(measured, rel=0.01)


@pytest.mark.slow
def test_gradient_checkpointing_lowers_the_peak_as_it_does_for_real():
    def deep(checkpointing):
        # each block saves three tensors for backward; checkpointed, only its input
        blocks = [nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(6)]
        return CheckpointedSequential(blocks, nn.Linear(64, 2), checkpointing)

    plain = step(lambda: deep(False), shape=(64,), classes=2, batch=256)
    saved = step(lambda: deep(True), shape=(64,), classes=2, batch=256)
    plain_trace, saved_trace = trace_step(plain), trace_step(saved)
    assert saved_trace.peak_bytes < 0.7 * plain_trace.peak_bytes
    assert saved_trace.peak_bytes == pytest.approx(measured_peak_bytes(saved, torch.device("cpu")), rel=0.02)
    # recompute in backward costs FLOPs: a second forward of the blocks
    assert saved_trace.micro_batch_flops > plain_trace.micro_batch_flops


def test_bf16_autocast_shrinks_the_memory_each_extra_sample_costs():
    def per_sample(precision):
        small, large = (trace_step(step(lambda: linear_stack((64, 1024, 1024, 10)), shape=(64,), batch=b,
                                        precision=precision)) for b in (256, 512))
        return (large.micro_batch_peak_bytes - small.micro_batch_peak_bytes) / 256

    fp32, bf16 = per_sample("fp32"), per_sample("bf16")
    assert fp32 > 2 * 1024 * 4  # at least the two hidden activations, 4 bytes each
    assert bf16 < 0.8 * fp32


def test_cuda_trace_rounds_every_block_to_512_bytes():
    s = step(lambda: linear_stack((7, 3, 5)), shape=(7,), classes=5, batch=3)
    cpu, cuda = trace_step(s), trace_step(s.on("cuda"))
    assert cuda.peak_bytes % CUDA_ALLOCATION_ROUNDING == 0
    assert cuda.peak_bytes > cpu.peak_bytes


def test_a_billion_byte_model_is_traced_without_allocating_it():
    widths = (8192, 8192, 8192, 10)  # ~134M parameters: 537 MB of fp32 weights, 2 GB with Adam
    before = psutil.Process().memory_info().rss
    trace = trace_step(step(lambda: linear_stack(widths), shape=(8192,), batch=4))
    grown = psutil.Process().memory_info().rss - before
    assert trace.parameter_bytes == parameter_bytes(widths)
    assert trace.peak_bytes > 4 * trace.parameter_bytes
    assert grown < 100 * 2**20


def test_im2col_workspace_of_cpu_low_precision_convolutions():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 3, 16, 16, dtype=torch.bfloat16)
        w = torch.empty(8, 3, 3, 3, dtype=torch.bfloat16)
        out = torch.empty(4, 8, 16, 16, dtype=torch.bfloat16)
        args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        conv = torch.ops.aten.convolution.default
        assert cpu_im2col_workspace(conv, args, out) == 4 * 3 * 3 * 3 * 16 * 16 * 2
        one_by_one = (x, torch.empty(8, 3, 1, 1, dtype=torch.bfloat16), None, [1, 1], [0, 0], [1, 1], False,
                      [0, 0], 1)
        assert cpu_im2col_workspace(conv, one_by_one, out) == 0
        fp32 = (x.float(), w.float(), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        assert cpu_im2col_workspace(conv, fp32, out.float()) == 0
        assert cpu_im2col_workspace(torch.ops.aten.mm.default, (x, w), out) == 0


def _fake(*specs):
    """Fake tensors from (shape, dtype) pairs, and the fake mode they live in."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        return mode, [torch.empty(shape, dtype=dtype) for shape, dtype in specs]


aten = torch.ops.aten
BF16, FP32 = torch.bfloat16, torch.float32
ATEN_CASES = {
    "bf16 mean (an fp32 copy of the input)": (aten.mean.dim, [((32, 16, 8, 8), BF16)], ([-1, -2],)),
    "bf16 + fp32 (the bf16 input promoted)": (aten.add.Tensor, [((64, 256), BF16), ((64, 256), FP32)], ()),
    "bf16 += fp32 (promoted, into a temporary)": (aten.add_.Tensor, [((64, 256), BF16), ((64, 256), FP32)], ()),
    "bf16 * broadcast fp32": (aten.mul.Tensor, [((64, 256), BF16), ((256,), FP32)], ()),
    "where(mask, fp32, bf16)": (aten.where.self, [((64, 256), torch.bool), ((64, 256), FP32), ((64, 256), BF16)],
                                ()),
    "safe softmax (mask of -inf rows)": (aten._safe_softmax.default, [((8, 4, 16, 16), FP32)], (-1,)),
    "batch norm backward (grad_input twice)": (
        aten.native_batch_norm_backward.default,
        [((16, 8, 8, 8), FP32), ((16, 8, 8, 8), FP32), ((8,), FP32), ((8,), FP32), ((8,), FP32), ((8,), FP32),
         ((8,), FP32)], (True, 1e-5, [True, True, True])),
    "group norm backward, bf16 input (ds, db; dtype)": (
        aten.native_group_norm_backward.default,
        [((16, 8, 8, 8), BF16), ((16, 8, 8, 8), BF16), ((16, 4), FP32), ((16, 4), FP32), ((8,), FP32)],
        (16, 8, 64, 4, [True, True, True])),
}


@pytest.mark.parametrize("case", list(ATEN_CASES))
def test_aten_rules_equal_what_the_real_kernel_allocates(case):
    from trainwise.plan.workspaces import CpuKernels, KernelProbe

    func, specs, rest = ATEN_CASES[case]
    mode, tensors = _fake(*specs)
    args = (*tensors, *rest)
    with mode:
        out = func(*args)
        out, memory = CpuKernels(KernelProbe())(func, args, {}, out)
    real = KernelProbe()(func, args, {}, out)  # the CPU kernel itself, run on zeros of these shapes
    assert memory is not None and memory.workspace == real.workspace > 0
    # the outputs (their dtypes, for group norm's grad_input) are what the CPU kernel returns
    assert all(size is None for size in real.output_bytes)


def test_probing_a_large_op_extrapolates_from_smaller_batches():
    from trainwise.plan.workspaces import KernelProbe

    mode, (x, w) = _fake(((64, 16, 32, 32), FP32), ((32, 16, 3, 3), FP32))
    with mode:
        grad = torch.empty(64, 32, 32, 32)
    args = (grad, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    with mode:
        out = aten.convolution_backward.default(*args)
    whole = KernelProbe(limit_bytes=2**40)(aten.convolution_backward.default, args, {}, out)
    scaled = KernelProbe(limit_bytes=2**20)(aten.convolution_backward.default, args, {}, out)
    assert whole.workspace > 0
    assert scaled.workspace == pytest.approx(whole.workspace, rel=0.02)


def test_the_lstm_workspace_saved_for_backward_is_counted_at_its_real_size():
    """aten/src/ATen/native/mkldnn/RNN.cpp returns oneDNN's training workspace as a tensor that autograd
    keeps until backward; the fake kernel returns it empty."""
    from trainwise.plan.workspaces import CpuKernels, KernelProbe

    mode, (x, w_ih, w_hh, b_ih, b_hh, h, c) = _fake(((10, 32, 8), FP32), ((128, 8), FP32), ((128, 32), FP32),
                                                  ((128,), FP32), ((128,), FP32), ((32, 32), FP32),
                                                  ((32, 32), FP32))
    args = (x, w_ih, w_hh, b_ih, b_hh, h, c, False, [], 2, 32, 1, True, False, False, True)
    with mode:
        out = aten.mkldnn_rnn_layer.default(*args)
        _, memory = CpuKernels(KernelProbe())(aten.mkldnn_rnn_layer.default, args, {}, out)
    assert out[3].untyped_storage().nbytes() == 0
    # oneDNN's workspace holds the gates and states of every step: several times the output
    assert memory.output_bytes[3] > 4 * 10 * 32 * 32 * 4
    scaled = KernelProbe(limit_bytes=2**16)(aten.mkldnn_rnn_layer.default, args, {}, out)  # at 11 and 22
    assert scaled.output_bytes[3] == pytest.approx(memory.output_bytes[3], rel=0.05)


def test_an_embedding_bag_is_probed_without_its_table():
    """Its buffers follow the indices: a table larger than the probe's limit is probed with one row."""
    from trainwise.plan.workspaces import KernelProbe

    mode, (weight, indices, offsets) = _fake(((5000, 16), FP32), ((768,), torch.long), ((64,), torch.long))
    args = (weight, indices, offsets, False, 1)  # mean
    with mode:
        out = aten._embedding_bag.default(*args)
    whole = KernelProbe(limit_bytes=2**40)(aten._embedding_bag.default, args, {}, out)
    small = KernelProbe(limit_bytes=2**16)(aten._embedding_bag.default, args, {}, out)  # table: 320 kB
    assert small.workspace == whole.workspace > 0
    assert all(size is None for size in small.output_bytes)


def test_under_a_running_profiler_the_probe_stands_aside_for_a_bound():
    from torch.profiler import ProfilerActivity, profile

    from trainwise.plan.workspaces import CpuKernels, KernelProbe

    mode, (x, w) = _fake(((8, 16, 16, 16), FP32), ((32, 16, 3, 3), FP32))
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    with mode:
        out = aten.convolution.default(*args)
    probe = KernelProbe()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):  # a second one would end this one
        assert probe(aten.convolution.default, args, {}, out) is None
        _, bound = CpuKernels(probe)(aten.convolution.default, args, {}, out)
    measured = probe(aten.convolution.default, args, {}, out)
    assert 0 < measured.workspace <= bound.workspace


def test_token_inputs_for_an_embedding_model():
    build = lambda: nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(16 * 12, 3))  # noqa: E731
    s = step(build, shape=(12,), classes=3, batch=4, input_dtype=torch.long, vocabulary_size=50)
    assert trace_step(s).peak_bytes == pytest.approx(measured_peak_bytes(s, torch.device("cpu")), rel=0.01)


def test_models_that_deepcopy_layers_while_built_are_traced_like_any_other():
    class Encoder(nn.Module):  # nn.TransformerEncoder deep-copies its layer: copies of fake tensors
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(32, 2)

        def forward(self, x):
            return self.head(self.encoder(x.view(x.shape[0], 4, 32)).mean(1))

    s = step(Encoder, shape=(128,), classes=2, batch=8)
    assert trace_step(s).peak_bytes == pytest.approx(measured_peak_bytes(s, torch.device("cpu")), rel=0.02)


class TiedHead(nn.Module):
    """An embedding read twice (the lookup and the output head): its two gradients meet in backward."""

    def __init__(self, vocab=4096, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


def test_tied_gradients_are_summed_in_place_as_autograd_does_for_real():
    # under bf16 autocast the head's gradient arrives as a fresh fp32 copy: autograd adds the lookup's gradient
    # into it; fake tensors are added out of place (a tensor subclass), one table more than the real step
    s = step(TiedHead, shape=(8,), classes=4096, batch=4, input_dtype=torch.int64, vocabulary_size=4096,
             precision="bf16")
    trace = trace_step(s)
    assert trace.peak_bytes == pytest.approx(measured_peak_bytes(s, torch.device("cpu")), rel=0.01)
