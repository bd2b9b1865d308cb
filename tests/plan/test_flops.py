"""FLOPs per step from torch's FlopCounterMode, against the formulas for matmuls and convolutions."""
import torch
from torch import nn

from trainwise.plan.flops import FlopTally, conv2d_flops, matmul_flops
from trainwise.plan.memory import trace_step
from trainwise.plan.traced_step import TrainingStep


def test_matmul_forward_and_backward_against_the_formula():
    layer = nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64, requires_grad=True)
    with FlopTally() as tally:
        layer(x).sum().backward()
    # forward, gradient of the input, gradient of the weight: three (16×64)·(64×32) products
    assert tally.total == 3 * matmul_flops(16, 32, 64)


def test_conv2d_forward_against_the_formula():
    conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
    with torch.no_grad(), FlopTally() as tally:
        conv(torch.randn(2, 3, 10, 10))
    assert tally.total == conv2d_flops(2, 3, 8, (3, 3), (10, 10))


def test_traced_step_counts_forward_and_backward_of_a_linear_stack():
    model = lambda: nn.Sequential(nn.Linear(30, 20), nn.ReLU(), nn.Linear(20, 4))  # noqa: E731
    trace = trace_step(TrainingStep(build_model=model, input_shape=(30,), num_classes=4, micro_batch_size=8))
    first = 2 * matmul_flops(8, 20, 30)  # the batch needs no gradient: forward + weight gradient
    second = 3 * matmul_flops(8, 4, 20)  # forward + input gradient + weight gradient
    assert trace.micro_batch_flops == first + second
