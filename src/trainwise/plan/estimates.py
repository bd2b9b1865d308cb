"""What advice reads from a job's traces: the peak-memory curve against the micro-batch, and the plain numbers
(FLOPs, bytes, op counts, sizes) the step-time model and the cards' fits are computed from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeakCurve:
    """Peak bytes of a training step against the micro-batch, from traces at a few sizes.

    Forward/backward memory is piecewise linear in the micro-batch (where the peak falls can move, e.g.
    from late in backward to its start as activations grow) and convex, so straight lines between traced
    sizes lie on or above it: safe for choosing a micro-batch. The optimizer step's peak is a floor."""

    points: tuple[tuple[int, float], ...]  # (micro-batch, forward/backward peak), sorted
    optimizer_peak_bytes: float

    def peak(self, micro_batch: float) -> float:
        return max(self._forward_backward(micro_batch), self.optimizer_peak_bytes)

    def _forward_backward(self, b: float) -> float:
        pts = self.points
        if len(pts) == 1:
            return pts[0][1]
        for (b0, m0), (b1, m1) in zip(pts, pts[1:]):
            if b <= b1:
                return m0 + (m1 - m0) * (b - b0) / (b1 - b0)
        (b0, m0), (b1, m1) = pts[-2], pts[-1]
        return m1 + (m1 - m0) * (b - b1) / (b1 - b0)

    @property
    def per_sample_bytes(self) -> float:
        """Slope of the largest traced interval: what one more sample costs at large micro-batches."""
        if len(self.points) < 2:
            return 0.0
        (b0, m0), (b1, m1) = self.points[-2], self.points[-1]
        return max((m1 - m0) / (b1 - b0), 0.0)

    def largest_micro_batch(self, budget: float, limit: int, saving: float = 0.0) -> int:
        """Largest micro-batch ≤ limit whose peak, less `saving`, fits `budget` (0: not even one)."""
        if self.peak(1) - saving > budget:
            return 0
        low, high = 1, max(limit, 1)
        while low < high:  # the peak never falls as the micro-batch grows
            middle = (low + high + 1) // 2
            if self.peak(middle) - saving <= budget:
                low = middle
            else:
                high = middle - 1
        return low


@dataclass(frozen=True)
class Estimates:
    """What advice needs from the traces (see job.JobEstimate): plain numbers only."""

    batch_size: int
    micro_batch_size: int
    total_steps: int
    steps_per_epoch: int
    precision: str
    cpu_precision: str
    cuda_memory: PeakCurve  # traced with CUDA's allocator rounding and multi-tensor optimizer
    cpu_memory: PeakCurve  # traced in the CPU's precision, with its kernels' hidden workspaces
    sharded_state_bytes: float  # parameters + gradients + optimizer state: what FSDP divides
    largest_module_parameter_bytes: float
    flops_per_sample: float
    bytes_per_sample: float
    ops_per_micro_batch: float
    optimizer_bytes: float
    optimizer_ops: float
    has_convolutions: bool = False
    dataset_bytes: int = 0
    sample_bytes: int = 0
    checkpoint_bytes: int = 0
    checkpoints_kept: int = 3
    weight_bytes: int = 0  # the model's parameters (the final save holds them twice in host RAM)

    def peak(self, micro_batch: int, device: str = "cuda") -> float:
        return (self.cpu_memory if device == "cpu" else self.cuda_memory).peak(micro_batch)
