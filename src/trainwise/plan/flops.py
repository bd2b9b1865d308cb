"""FLOPs of a training step, counted by torch's own FlopCounterMode while the step is traced.

FlopCounterMode has a formula per aten op (matmuls, convolutions, attention); elementwise ops count as
zero, which is why the time model in advise.py also has a memory-traffic bound and a per-op overhead.
Backward and activation-checkpointing recompute are counted as they run, so they are in the total.
"""
from __future__ import annotations

from torch.utils.flop_counter import FlopCounterMode


class FlopTally:
    """A context that counts the FLOPs of everything run inside it (nestable with other dispatch modes)."""

    def __init__(self) -> None:
        self._mode = FlopCounterMode(display=False)
        self.total = 0
        self.by_op: dict[str, int] = {}

    def __enter__(self) -> "FlopTally":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self.total += self._mode.get_total_flops()
        for op, count in self._mode.get_flop_counts().get("Global", {}).items():
            self.by_op[str(op)] = self.by_op.get(str(op), 0) + int(count)


def matmul_flops(m: int, n: int, k: int) -> int:
    """An (m×k) @ (k×n) product: one multiply and one add per term."""
    return 2 * m * n * k


def conv2d_flops(batch: int, in_channels: int, out_channels: int, kernel: tuple[int, int],
                 output_size: tuple[int, int]) -> int:
    """Forward FLOPs of a 2-d convolution (no groups): 2 · N · C_out · H_out · W_out · C_in · kH · kW."""
    return 2 * batch * out_channels * output_size[0] * output_size[1] * in_channels * kernel[0] * kernel[1]
