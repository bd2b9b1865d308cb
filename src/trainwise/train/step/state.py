"""Where a run is: the few numbers the loop advances and a checkpoint restores, in one small record."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TrainState:
    micro_batch_size: int
    """Samples per forward/backward; an out-of-memory recovery may lower it, and a resume keeps that choice."""
    step: int = 0
    """Optimizer steps done."""
    epoch: int = 0
    """Epochs started."""
    batch_in_epoch: int = 0
    """Optimizer steps done in this epoch: the position the data order resumes from."""
    skipped_steps: int = 0
    """Updates not applied (non-finite gradients, fp16 overflow), as of the last settle point."""

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
