"""`trainwise train ... --nproc N` starts the ranks through PyTorch's launcher: the same job as one process
with the same global batch, one writer, and the launch options checked before anything starts."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ONE_THREAD, ROOT, invoke
from tests.conftest import finish_job
from trainwise.launch.torchrun import Launch

ARGS = ["breast-cancer", "train.max_steps=12", "schedule.warmup_steps=3", "train.batch_size=32",
        "train.micro_batch_size=16", "model.args.dropout=0", "data.augment=false", "eval.every_steps=6",
        "telemetry.enabled=false", "train.log_every=6", "train.sanity=false"]


@pytest.mark.slow
def test_nproc_2_trains_the_same_weights_as_one_process(tmp_path, capsys, one_thread):
    single, ranks = tmp_path / "single", tmp_path / "ranks"
    # the launcher in a process of its own (it starts torchrun's agent in the process it runs in); the one
    # process to compare with trains here meanwhile
    launched = subprocess.Popen([sys.executable, "-m", "trainwise", "train", *ARGS, "--out", str(ranks),
                                 "--nproc", "2"], env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **ONE_THREAD},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert invoke(capsys, "train", *ARGS, "--out", str(single)).returncode == 0
    code, output = finish_job(launched, timeout=300)
    assert code == 0, output[-3000:]
    summary = json.loads((ranks / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 12
    started = [json.loads(line) for line in (ranks / "events.jsonl").read_text().splitlines()
               if '"started"' in line][0]
    assert started["evidence"].get("ranks", 2) == 2
    a, b = load_file(single / "model.safetensors"), load_file(ranks / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


def test_several_nodes_need_a_rendezvous_endpoint(tmp_path, capsys):
    result = invoke(capsys, "train", *ARGS, "--out", str(tmp_path / "r"), "--nproc", "2", "--nnodes", "2")
    assert result.returncode == 2 and "--rdzv-endpoint" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


SIGNALS = ["--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1,SIGHUP,SIGQUIT"]  # passed on to the ranks


def test_torchrun_arguments_for_one_machine_and_for_several():
    assert Launch(4).torchrun_args(["train", "digits"]) == [
        "--nproc-per-node", "4", "--standalone", *SIGNALS, "-m", "trainwise", "train", "digits"]
    several = Launch(8, nnodes=2, node_rank=1, rdzv_endpoint="head-node:29500", run_id="r1")
    assert several.torchrun_args(["resume", "runs/r1"]) == [
        "--nproc-per-node", "8", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head-node:29500",
        "--rdzv-id", "r1", "--node-rank", "1", *SIGNALS, "-m", "trainwise", "resume", "runs/r1"]


@pytest.mark.slow
def test_bad_input_only_the_ranks_can_see_is_said_once_by_rank_0(tmp_path):
    """A batch larger than the training split is known only once the data is loaded, on every rank: rank 0
    says it, the others stay silent, the launcher's own log (SIGTERM to the others, "failed (exitcode: 2)")
    is quiet, and the job exits 2."""
    out = tmp_path / "r"
    launched = subprocess.Popen([sys.executable, "-m", "trainwise", "train", *ARGS, "train.batch_size=100000",
                                 "train.micro_batch_size=null", "--out", str(out), "--nproc", "2"],
                                env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200", **ONE_THREAD},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    code, output = finish_job(launched, timeout=300)
    assert code == 2, output[-3000:]
    assert output.count("error:") == 1 and "fewer than one batch" in output, output[-3000:]
    assert "SIGTERM" not in output and "exitcode" not in output and "Traceback" not in output, output[-3000:]
