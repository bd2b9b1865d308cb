"""torchrun with two CPU ranks (Gloo): the same update as one process accumulating the same micro-batches."""
import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import invoke
from tests.conftest import finish_job, start_torchrun
from trainwise.train.parallel.sampler import ResumableBatchSampler

ARGS = ["breast-cancer", "train.max_steps=20", "schedule.warmup_steps=5", "train.batch_size=32", "train.micro_batch_size=16",
        "model.args.dropout=0", "data.augment=false", "eval.every_steps=10", "telemetry.enabled=false",
        "train.log_every=5"]


def test_ranks_split_each_epoch_between_them():
    ranks = [ResumableBatchSampler(100, 8, 6, seed=1, rank=r, world_size=2) for r in range(2)]
    one = ResumableBatchSampler(100, 8, 12, seed=1)
    seen = [list(s) for s in ranks]
    assert [b for pair in zip(*seen) for b in pair] == list(one)  # interleaved, they are the one-process order


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process(tmp_path, capsys, one_thread):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    job = start_torchrun("train", *ARGS, "--out", str(ddp))
    assert invoke(capsys, "train", *ARGS, "--out", str(single)).returncode == 0  # here, while the job runs
    code, output = finish_job(job, timeout=300)
    assert code == 0, output[-3000:]
    summary = json.loads((ddp / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 20
    train_lines = [json.loads(line) for line in (ddp / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train_lines if r["split"] == "train"] == [5, 10, 15, 20]  # one writer
    single_lines = [json.loads(line) for line in (single / "metrics.jsonl").read_text().splitlines()]
    losses = [[r["loss"] for r in lines if r["split"] == "train"] for lines in (single_lines, train_lines)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-6)  # reduced over both ranks' samples
    a, b = load_file(single / "model.safetensors"), load_file(ddp / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
