"""`trainwise train ... --nproc N`: the ranks are started by PyTorch's own launcher (torch.distributed.run,
what `torchrun` is), never by a launcher of ours. One machine: standalone rendezvous. Several machines: a
c10d rendezvous at `--rdzv-endpoint HOST:PORT`, the same command on every node with `--nnodes`.

Each rank runs the same `trainwise` command without the launch options, with torchrun's environment
(RANK, LOCAL_RANK, WORLD_SIZE); plain `torchrun ... -m trainwise train ...` does exactly the same.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainwise.errors import ConfigError, TrainingError

STOPPED_EXIT_CODE = 75  # EX_TEMPFAIL: stopped by a signal, checkpointed, resumable
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", "SIGQUIT")
# set for the ranks `trainwise ... --nproc N` starts: what the launcher already said before them, they do not repeat
STARTED_BY_TRAINWISE = "TRAINWISE_LAUNCHED"


@dataclass(frozen=True)
class Launch:
    nproc: int
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    run_id: str = "trainwise"

    @property
    def ranks(self) -> int:
        return self.nproc * self.nnodes

    def check(self) -> None:
        """The launch options among themselves (ConfigError)."""
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT (a port on the first node "
                              "that every node can reach), given to the same command on every node.")

    def torchrun_args(self, command: list[str]) -> list[str]:
        self.check()
        args = ["--nproc-per-node", str(self.nproc)]
        if self.rdzv_endpoint:
            args += ["--nnodes", str(self.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", self.rdzv_endpoint,
                     "--rdzv-id", self.run_id]
            if self.node_rank is not None:
                args += ["--node-rank", str(self.node_rank)]
        else:
            args.append("--standalone")
        # the ranks stop cleanly on each of these (train/recovery/signals.py): the launcher passes them on, SLURM's
        # SIGUSR1 included, rather than dying of it and leaving the ranks to be killed
        args += ["--signals-to-handle", ",".join(FORWARDED_SIGNALS)]
        return [*args, "-m", "trainwise", *command]


def inside_a_launch() -> bool:
    """Already one rank of a torchrun job: a `--nproc` given again must not launch ranks of ranks."""
    return "LOCAL_RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ


def launch(command: list[str], plan: Launch, run_dir: Path) -> int:
    """Run `trainwise COMMAND` on `plan.nproc` ranks per node; the exit code the job should end with."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // plan.nproc)))
    os.environ[STARTED_BY_TRAINWISE] = "1"  # the ranks inherit it
    started = time.time()
    # the agent's own log ("Sending process … closing signal SIGTERM", "failed (exitcode: 2)") repeats what the
    # ranks said or what the TrainingError below says in words: quiet in this process, which only runs the agent
    logging.disable(logging.ERROR)
    try:
        run(get_args_parser().parse_args(plan.torchrun_args(command)))
    except SignalException as stopped:  # Ctrl-C or a scheduler's SIGTERM to this process: the agent passed it on
        return exit_code_after_signal(int(stopped.sigval), run_dir, since=started)
    except ChildFailedError as failed:
        failures = failed.failures
        codes = {rank: failure.exitcode for rank, failure in failures.items()}
        if codes and all(code == STOPPED_EXIT_CODE for code in codes.values()):
            return STOPPED_EXIT_CODE  # every rank stopped on the same step and checkpointed
        first = min(codes, key=lambda rank: failures[rank].timestamp) if codes else None
        if first is not None and codes[first] == 2:
            return 2  # bad input: that rank printed the message
        died = ", ".join(f"rank {rank} (exit code {code})" for rank, code in sorted(codes.items()))
        raise TrainingError(f"{died} of the {plan.nproc}-rank job failed; rank {first} first. Its error is above; "
                            "the run directory's error.log and summary.json hold rank 0's view.") from None
    finally:
        logging.disable(logging.NOTSET)
        os.environ.pop(STARTED_BY_TRAINWISE, None)
    return 0


def exit_code_after_signal(signum: int, run_dir: Path, since: float = 0.0) -> int:
    """The job's exit code once the launcher was signalled and its ranks were given the signal too (and waited
    for, up to torch's shutdown timeout): 75 where rank 0 recorded a clean stop with its checkpoint (it printed
    how to continue) after `since`, the job's start (not an earlier run's summary), else the shell's 128 +
    signal (130 for Ctrl-C) for a job stopped before it had a step to keep."""
    from trainwise.rundir.layout import RunDir

    summary = RunDir(run_dir).read_summary()  # {} before training started
    stopped = summary.get("status") == "stopped" and float(summary.get("updated") or 0) >= since
    return STOPPED_EXIT_CODE if stopped else 128 + signum
