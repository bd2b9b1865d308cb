"""The traced peak of a training step: exact where memory is known by hand, and equal to what the CPU
allocator really reaches (measured with torch.profiler's allocation events)."""
import psutil
import pytest
import torch
from torch import nn

from trainwise.plan.memory import (CUDA_ALLOCATION_ROUNDING, TrainingStep, cpu_im2col_workspace,
                                   trace_step)
from trainwise.plan.probe import measured_peak_bytes
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


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_estimate_equals_the_cpu_allocators_real_peak(precision):
    s = step(lambda: linear_stack((30, 256, 256, 2)), shape=(30,), classes=2, batch=256, precision=precision,
             grad_clip_norm=1.0, accumulation_steps=2)
    trace = trace_step(s)
    measured = measured_peak_bytes(s, torch.device("cpu"))
    assert trace.peak_bytes == pytest.approx(measured, rel=0.01)


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
