"""One rank of a 2-rank DDP job (Gloo) for tests/train/test_ddp_oom_recovery.py, started by torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/train/ddp_oom_worker.py OUT MICRO LIMIT

Only rank 1 "runs out of memory" (raises torch.OutOfMemoryError for micro-batches over LIMIT samples, as a
card holding LIMIT samples would; with a fourth argument N, also at its N-th training forward, whatever the
size). Each rank saves its final weights, micro-batch and host-sync counts."""
import os
import sys
from pathlib import Path

import torch

from tests.conftest import tiny_config
from tests.train.test_oom_recovery import SPEC, OutOfMemoryAbove, _data
from trainwise.rundir.layout import RunDir
from trainwise.train.loop.host_syncs import HostSyncCounter
from trainwise.train.loop.trainer import Trainer

MAX_STEPS, LOG_EVERY, CHECKPOINT_EVERY = 12, 4, 6


class OutOfMemoryAtForward(OutOfMemoryAbove):
    def __init__(self, limit, at_forward):
        super().__init__(limit)
        self.at_forward, self.forwards = at_forward, 0

    def forward(self, x):
        self.forwards += self.training
        if self.forwards == self.at_forward:
            raise torch.OutOfMemoryError(f"CUDA out of memory at forward {self.forwards}")
        return super().forward(x)


def main(out: Path, micro_batch_size: int, limit: int, at_forward: int | None = None) -> None:
    rank = int(os.environ["RANK"])
    config = tiny_config(train={"max_steps": MAX_STEPS, "batch_size": 32, "micro_batch_size": micro_batch_size,
                                "log_every": LOG_EVERY, "device": "cpu", "grad_clip_norm": 1.0, "strategy": "ddp",
                                "dist_timeout_s": 60},
                         data={"num_workers": 0}, eval={"every_steps": None, "every_epoch": False},
                         checkpoint={"every_steps": CHECKPOINT_EVERY})
    run = RunDir.create(out / "run") if rank == 0 else RunDir(out / "run")
    if rank != 1:
        model = OutOfMemoryAbove(10**9)
    else:
        model = OutOfMemoryAbove(limit) if at_forward is None else OutOfMemoryAtForward(limit, at_forward)
    counter = HostSyncCounter()
    trainer = Trainer(model, _data(), config=config, run_dir=run, callbacks=[counter.step_marker()],
                      data_spec=SPEC)
    with counter:
        summary = trainer.fit()
    torch.save({"weights": trainer.model.state_dict(), "micro_batch_size": trainer.micro_batch_size,
                "accumulation_steps": trainer.accumulation_steps, "status": summary["status"],
                "syncs": counter.by_step}, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *map(int, sys.argv[2:]))
