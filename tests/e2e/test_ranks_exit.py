"""A finished multi-rank run exits 0, and says so once (issues 26 and 27). Every rank leaves its process group
after the last collective; a rank that left it to the interpreter's exit died of SIGABRT after a completed run
now and then ("terminate called without an active exception"), so the 2-rank job of every recipe kind runs
five times here. The jobs are as small as a job can be (two steps, tiny data, no telemetry, no sanity check)
and run two at a time; the digits job goes through `trainwise train --nproc 2` on its recipe's own batch, as
the README shows it, the others through torchrun itself."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ONE_THREAD, ROOT, finish_job, start_torchrun

SMALL = ["train.max_steps=2", "train.epochs=null", "schedule.warmup_steps=0", "schedule.warmup_fraction=null",
         "train.log_every=2", "eval.every_steps=null", "eval.every_epoch=false", "telemetry.enabled=false",
         "train.sanity=false"]
SHOP = ["data.args.users=60", "data.args.items=40", "data.args.events=1200", "data.args.categories=3",
        "data.args.max_eval_queries=8", "train.batch_size=16"]
JOBS = {"digits": ["digits", "eval.early_stopping.enabled=false"],  # image; its batch of 64 split over 2
        "breast-cancer": ["breast-cancer"],  # table
        "shop-sasrec": ["shop-sasrec", *SHOP],
        "shop-din": ["shop-din", *SHOP]}


def start(kind: str, out) -> subprocess.Popen:
    args = ["train", *JOBS[kind], *SMALL, "--out", str(out)]
    if kind != "digits":
        return start_torchrun(*args)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200", **ONE_THREAD}
    return subprocess.Popen([sys.executable, "-m", "trainwise", *args, "--nproc", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def check_clean_finish(code: int, output: str, out) -> None:
    assert code == 0, output[-3000:]
    assert "terminate called" not in output and "Grad strides" not in output, output[-3000:]
    outcomes = [line for line in output.splitlines() if " after " in line and " steps" in line]
    assert len(outcomes) == 1 and outcomes[0].startswith("completed after 2 steps"), output[-3000:]  # rank 0's
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def run_five_times(tmp_path, pair: tuple[str, str]) -> None:
    for attempt in range(5):
        runs = {kind: tmp_path / f"{kind}-{attempt}" for kind in pair}
        jobs = {kind: start(kind, out) for kind, out in runs.items()}
        for kind, job in jobs.items():
            check_clean_finish(*finish_job(job), runs[kind])


# a class each: `make test` (pytest-xdist, --dist loadscope) gives each its own worker
class TestImageAndTable:
    @pytest.mark.slow
    def test_two_rank_jobs_exit_0_five_times_out_of_five(self, tmp_path):
        run_five_times(tmp_path, ("digits", "breast-cancer"))


class TestRecommenders:
    @pytest.mark.slow
    def test_two_rank_jobs_exit_0_five_times_out_of_five(self, tmp_path):
        run_five_times(tmp_path, ("shop-sasrec", "shop-din"))
