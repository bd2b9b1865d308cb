"""When the loop logs, evaluates and checkpoints: each decided here, from the config, for the step just done.
The last step always logs, evaluates (when there is validation data) and checkpoints."""
from __future__ import annotations

from dataclasses import dataclass

from trainwise.config import RunConfig


@dataclass(frozen=True)
class Cadence:
    max_steps: int
    log_every: int
    eval_every_steps: int | None
    eval_every_epoch: bool
    checkpoint_every_steps: int | None
    has_validation: bool

    @classmethod
    def from_config(cls, config: RunConfig, *, max_steps: int, has_validation: bool) -> "Cadence":
        return cls(max_steps, config.train.log_every, config.eval.every_steps, config.eval.every_epoch,
                   config.checkpoint.every_steps, has_validation)

    def should_log(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.max_steps

    def should_evaluate(self, step: int, *, end_of_epoch: bool) -> bool:
        if not self.has_validation:
            return False
        every = self.eval_every_steps
        return bool((every and step % every == 0) or (end_of_epoch and self.eval_every_epoch)
                    or step == self.max_steps)

    def should_checkpoint(self, step: int) -> bool:
        """A checkpoint of its own; an evaluation step writes one anyway (best or not)."""
        every = self.checkpoint_every_steps
        return bool(every and step % every == 0) or step == self.max_steps
