"""The micro-batch of a multi-rank job (issue 26): unset means the global batch split over the ranks; only a
batch the ranks cannot share, or an explicit micro-batch that does not divide a rank's share, is refused,
each with the sizes that work. The trainer, the planner and the launcher ask the config, the one owner."""
import json

import pytest
import torch
from torch import nn

from tests.conftest import invoke, tiny_config
from trainwise.errors import ConfigError


@pytest.mark.parametrize("micro, ranks, expected", [
    (None, 1, (64, 1)), (None, 2, (32, 1)), (None, 8, (8, 1)),  # the README's --nproc: the batch split
    (16, 1, (16, 4)), (16, 2, (16, 2)), (8, 4, (8, 2)), (32, 2, (32, 1)),  # explicit: accumulate the rest
])
def test_the_micro_batch_on_n_ranks(micro, ranks, expected):
    train = tiny_config(train={"batch_size": 64, "micro_batch_size": micro}).train
    assert (train.micro_batch_for(ranks), train.accumulation_steps_for(ranks)) == expected
    per_rank, accumulated = expected
    assert per_rank * accumulated * ranks == 64  # the global batch is kept exactly


def test_a_batch_the_ranks_cannot_share_is_refused_with_the_sizes_that_work():
    with pytest.raises(ConfigError, match=r"train.batch_size \(64\) cannot be split evenly over 3 ranks.*63 or 66"):
        tiny_config(train={"batch_size": 64}).train.micro_batch_for(3)


def test_an_explicit_micro_batch_that_cannot_work_is_refused_with_one_that_does():
    train = tiny_config(train={"batch_size": 64, "micro_batch_size": 64}).train
    assert train.micro_batch_for(1) == 64
    with pytest.raises(ConfigError, match=r"micro_batch_size \(64\).*64 / 2 ranks = 32.*micro_batch_size=32"):
        train.micro_batch_for(2)


def test_the_launcher_refuses_before_any_rank_starts(tmp_path, capsys):
    result = invoke(capsys, "train", "digits", "train.max_steps=40", "--out", str(tmp_path / "r"), "--nproc", "3")
    assert result.returncode == 2
    assert result.stderr.count("error:") == 1 and "cannot be split evenly over 3 ranks" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "r").exists()


def test_the_launcher_refuses_an_occupied_out_before_any_rank_starts(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = invoke(capsys, "train", "digits", "--out", str(out), "--nproc", "2")
    assert result.returncode == 2 and result.stderr.count("error:") == 1 and "already holds files" in result.stderr
    assert (out / "notes.txt").read_text() == "mine"


def test_plan_nproc_shows_the_micro_batch_train_runs(capsys):
    from trainwise.recipes import load_recipe

    result = invoke(capsys, "plan", "digits", "--nproc", "4", "--gpu", "A100-80GB", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    job, train = plan["job"], load_recipe("digits", []).train
    assert (job["micro_batch_size"], job["accumulation_steps"], job["ranks"]) == (
        train.micro_batch_for(4), train.accumulation_steps_for(4), 4) == (16, 1, 4)
    assert {row["micro_batch_size"] for row in plan["strategies"][0]["per_rank"].values()} == {16}


def test_augmented_single_channel_images_keep_standard_strides_so_ddp_buckets_match():
    """The cause of DDP's "Grad strides do not match bucket view strides" on digits: the shift returned one-
    channel images with channels-last strides, so the first convolution's weight gradient was channels-last."""
    from trainwise.data.augment import random_shift

    torch.manual_seed(0)
    images = random_shift(torch.randn(16, 1, 8, 8))
    assert images.stride() == torch.empty(16, 1, 8, 8).stride()
    conv = nn.Conv2d(1, 4, 3, padding=1)
    conv(images).sum().backward()
    assert conv.weight.grad.stride() == conv.weight.stride()


def test_a_rank_leaves_the_process_group_after_a_run_and_keeps_it_after_a_failure():
    import torch.distributed as dist

    from trainwise.train.parallel.distributed import leaving_the_job

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with leaving_the_job():
        dist.all_reduce(torch.ones(1))
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="a failing rank"), leaving_the_job():
            raise RuntimeError("a failing rank")
        assert dist.is_initialized()  # a shutdown under peers mid-collective could hang: the exit ends it
    finally:
        dist.destroy_process_group()
