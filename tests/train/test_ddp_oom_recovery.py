"""Out of memory on one rank of a DDP job (two CPU ranks, Gloo): every rank agrees, shrinks the micro-batch the
same way and retries the same samples, during the guarded steps (train/recovery/oom.py); after them the loop reads
nothing from the device between settle points."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.train.ddp_oom_worker import CHECKPOINT_EVERY, LOG_EVERY, MAX_STEPS
from tests.conftest import finish_job
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import read_checkpoint
from trainwise.train.recovery.oom import GUARDED_STEPS

WORKER = ROOT / "tests" / "train" / "ddp_oom_worker.py"


def _start(out, *args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(WORKER), str(out), *map(str, args)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The module's three jobs, started at once so that their interpreter starts overlap; each test ends the
    ones it reads (a hang fails it, and ends the job, instead of waiting). Per rank 16 samples a step:
    - recovered: rank 1 holds 4 at most, so 16 -> 8 -> 4, agreed by both ranks;
    - reference: micro-batch 4 from the start;
    - late: rank 1's 8th forward (step 8, past the guarded steps) runs out of memory."""
    base = tmp_path_factory.mktemp("ddp_oom")
    started = {"recovered": _start(base / "recovered", 16, 4), "reference": _start(base / "reference", 4, 4),
               "late": _start(base / "late", 16, 16, 8)}
    yield base, started
    for job in started.values():  # the ones a deselected test never waited for
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()


@pytest.fixture(scope="module")
def runs(jobs):
    base, started = jobs
    ended = {name: finish_job(started[name], timeout=240) for name in ("recovered", "reference")}
    for name, (code, output) in ended.items():
        assert code == 0, (name, output[-4000:])
    recovered, reference = ([torch.load(base / name / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
                            for name in ended)
    return base, recovered, reference


@pytest.mark.slow
def test_one_rank_out_of_memory_both_shrink_and_match_the_small_micro_batch_run(runs):
    base, recovered, reference = runs
    assert [r["status"] for r in recovered] == ["completed", "completed"]
    assert [r["micro_batch_size"] for r in recovered] == [4, 4]  # the same on every rank
    assert [r["accumulation_steps"] for r in recovered] == [4, 4]
    for name, weight in recovered[0]["weights"].items():
        assert torch.equal(weight, recovered[1]["weights"][name]), name  # the ranks never diverged
        torch.testing.assert_close(weight, reference[0]["weights"][name], rtol=1e-5, atol=1e-6, msg=name)
    run = RunDir(base / "recovered" / "run")
    events = [e for e in run.read_events() if e["kind"] == "oom_recovered"]
    assert [e["evidence"]["micro_batch_size"] for e in events] == [8, 4]
    assert all(e["evidence"]["ranks"] == [1] and e["step"] == 1 for e in events)
    assert "on rank 1" in events[0]["message"] and "on every rank" in events[0]["message"]
    # the choice is saved with the checkpoint: a resume starts at micro-batch 4
    assert read_checkpoint(run.checkpoint_path("last"))["micro_batch_size"] == 4
    losses = [r["loss"] for r in run.read_metrics("train")]
    expected = [r["loss"] for r in RunDir(base / "reference" / "run").read_metrics("train")]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_guarded_steps_read_one_flag_each_and_the_steady_state_reads_nothing(runs):
    """The guarded steps are accounted for explicitly: each waits for the device exactly once (the all-reduced
    out-of-memory flag); every later step that is not a settle point waits not at all. A sync made while step
    N+1 runs is charged to step N (the last one ended), so guarded steps 1..3 show at 0..2."""
    _, recovered, reference = runs
    settle_points = {s for s in range(1, MAX_STEPS + 1) if s % LOG_EVERY == 0 or s % CHECKPOINT_EVERY == 0}
    settle_points.add(MAX_STEPS)
    for rank, result in enumerate(reference):
        syncs = result["syncs"]
        for step in range(1, GUARDED_STEPS):
            assert len(syncs.get(step, [])) == 1 and "distributed.py" in syncs[step][0], (rank, step, syncs)
        steady = {s: syncs[s] for s in syncs if s >= GUARDED_STEPS and s not in settle_points}
        assert steady == {}, f"rank {rank}: host syncs between settle points after the guarded steps: {steady}"
        assert syncs.get(LOG_EVERY), "the log step reads the device (the count would be blind otherwise)"
    for rank, result in enumerate(recovered):  # the two failed tries of step 1 read the flag too, at step 0
        assert sum("distributed.py" in call for call in result["syncs"].get(0, [])) >= 3
        steady = {s: c for s, c in result["syncs"].items() if s >= GUARDED_STEPS and s not in settle_points}
        assert steady == {}, f"rank {rank}: {steady}"


@pytest.mark.slow
def test_out_of_memory_after_the_guarded_steps_stops_every_rank_with_the_reason(jobs):
    """Past the guarded steps DDP's all-reduce runs inside backward: no agreement is possible, so the rank
    that ran out of memory says why and stops, and its peer stops on the lost-peer path: no hang."""
    base, started = jobs
    code, output = finish_job(started["late"], timeout=240)  # rank 1's 8th forward (step 8) runs out of memory
    assert code != 0
    assert "out of memory on rank 1 at step 8" in output and "cannot agree on a smaller" in output, output[-4000:]
    assert "trainwise resume" in output
    run = RunDir(base / "late" / "run")
    summary = run.read_summary()  # rank 0 writes it: its peer is gone, and it says which
    assert summary["status"] == "failed" and "rank 1 of this 2-rank job stopped answering" in summary["message"]
    assert read_checkpoint(run.checkpoint_path("last"))["step"] == 6  # the last checkpoint is intact
