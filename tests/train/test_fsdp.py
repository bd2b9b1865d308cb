"""FSDP2 (train.strategy=fsdp) on two CPU ranks (Gloo) under torchrun, and the pieces it stands on.

The slow tests launch real jobs: the same update as one process; a 2-rank checkpoint loaded into a plain model
and resumed by one process; a SIGTERM to one rank agreed by both and a bit-identical resume (for DDP as well);
a rank killed outright.
"""
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.conftest import finish_job, invoke, start_torchrun, tiny_config
from trainwise.errors import ConfigError, RunDirError
from trainwise.rundir.layout import RunDir
from trainwise.train.parallel.distributed import Ranks, resolve_strategy
from trainwise.train.parallel.fsdp import fsdp_blocks

# accumulation on both sides (4 micro-batches in one process, 2 per rank), checkpointed blocks, clipping on
SAME_UPDATE = ["breast-cancer", "train.max_steps=20", "schedule.warmup_steps=5", "train.batch_size=32",
               "train.micro_batch_size=8", "model.args.dropout=0", "data.augment=false", "eval.every_steps=10",
               "telemetry.enabled=false", "train.log_every=5", "model.gradient_checkpointing=true",
               "checkpoint.keep_last=5", "train.grad_clip_norm=0.5"]
# dropout and feature noise draw from each rank's RNG: a resume must restore every rank's stream
MAX_STEPS = 40
RESUMABLE = ["breast-cancer", f"train.max_steps={MAX_STEPS}", "schedule.warmup_steps=5", "train.batch_size=32",
             "train.micro_batch_size=8", "model.args.dropout=0.2", "data.augment=true", "eval.every_steps=25",
             "eval.early_stopping.enabled=false", "checkpoint.every_steps=15", "checkpoint.keep_last=2",
             "telemetry.enabled=false", "train.log_every=1"]


def _last_logged_step(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")), default=0)


def _rank_process(launcher: subprocess.Popen, rank: int, timeout: float = 60) -> psutil.Process:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank):
                    return child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never started")


def _wait_for_step(run: Path, step: int, launcher: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while _last_logged_step(run) < step and time.time() < deadline and launcher.poll() is None:
        time.sleep(0.01)


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


# ---- the strategy, the blocks, the checkpoint directories (fast) --------------------------------------------
def test_auto_is_single_for_one_process_and_ddp_for_several():
    assert resolve_strategy("auto", Ranks()) == "single"
    assert resolve_strategy("auto", Ranks(0, 4, 0)) == "ddp"
    assert resolve_strategy("fsdp", Ranks()) == "fsdp"  # unsharded, but its checkpoints still reshard


@pytest.mark.parametrize("strategy, ranks, says", [("single", Ranks(1, 2, 1), "torchrun started 2 ranks"),
                                                    ("ddp", Ranks(), "needs several processes")])
def test_a_strategy_that_does_not_fit_the_world_is_refused(strategy, ranks, says):
    with pytest.raises(ConfigError, match=says):
        resolve_strategy(strategy, ranks)


def test_builtin_models_shard_their_blocks_and_head():
    from trainwise.data.bundle import DataSpec
    from trainwise.recipes.models import mlp

    model = mlp(DataSpec(task="classification", input_shape=(3, 4), num_classes=2), hidden=(8, 8))
    # Flatten holds no parameters: nothing to shard
    assert fsdp_blocks(model) == [model.blocks[1], model.blocks[2], model.head]


class _Users(nn.Module):
    def __init__(self, blocks=None):
        super().__init__()
        self.embed, self.out = nn.Linear(4, 8), nn.Linear(8, 2)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self._blocks = blocks

    def fsdp_blocks(self):
        return list(self.layers) if self._blocks is None else self._blocks


def test_the_users_model_says_which_modules_are_blocks():
    model = _Users()
    assert fsdp_blocks(model) == list(model.layers)
    with pytest.raises(ConfigError, match="not a submodule"):
        fsdp_blocks(_Users(blocks=[nn.Linear(2, 2)]))
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert fsdp_blocks(plain) == [plain[0], plain[2]]  # no hook: the children that hold parameters
    plain[0].requires_grad_(False)  # frozen (method=freeze): still its own unit, not gathered with the root
    assert fsdp_blocks(plain) == [plain[0], plain[2]]


def test_a_collective_failing_under_the_model_is_blamed_on_the_lost_rank_not_the_model():
    from trainwise.errors import ModelCallError
    from trainwise.train.parallel.distributed import peer_lost

    gone = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    try:  # as FSDP's all-gather fails inside the forward, wrapped by the train step
        raise ModelCallError("the forward of mlp raised RuntimeError") from gone
    except ModelCallError as wrapped:
        error = wrapped
    lost = peer_lost(error, Ranks(0, 2, 0), step=17)
    assert "rank 1 of this 2-rank job stopped answering during step 17" in str(lost)
    assert "another rank" in str(peer_lost(gone, Ranks(3, 8, 3), step=1))
    assert peer_lost(gone, Ranks(), step=1) is None  # one process has no peers
    assert peer_lost(ValueError("shapes do not match"), Ranks(0, 2, 0), step=1) is None


def _commit(dirs, step: int, **kw) -> Path:
    partial = dirs.begin(step)
    (partial / ".metadata").write_bytes(b"m")
    dirs.write_state(partial, lambda f: f.write(str(step).encode()))
    return dirs.commit(step, **kw)


def test_checkpoint_directories_commit_point_and_rotate(tmp_path):
    run = RunDir.create(tmp_path / "run")
    dirs = run.checkpoint_dirs
    _commit(dirs, 10, is_best=True, keep_last=2)
    for step in (20, 30, 40):
        _commit(dirs, step, is_best=False, keep_last=2)
    # the newest two, and the one `best` names, survive rotation
    assert [s for s, _ in dirs.steps()] == [10, 30, 40]
    assert dirs.pointer("last") == dirs.path(40) and dirs.pointer("best") == dirs.path(10)
    assert run.checkpoint_dirs.latest(run.path).step == 40
    # a save killed mid-write leaves a partial directory: never chosen, swept by the next save
    (dirs.partial(50) / "junk").parent.mkdir()
    assert run.checkpoint_dirs.latest(run.path).step == 40
    _commit(dirs, 60, is_best=False, keep_last=2)
    assert not dirs.partial(50).exists()
    # a follower rank writes nothing
    follower = dirs.read_only()
    assert follower.begin(70) == dirs.partial(70) and not dirs.partial(70).exists()
    assert follower.commit(70, is_best=False, keep_last=2) == dirs.path(70) and not dirs.path(70).exists()


def test_an_incomplete_last_falls_back_to_the_newest_complete_step(tmp_path):
    run = RunDir.create(tmp_path / "run")
    dirs = run.checkpoint_dirs
    for step in (10, 20):
        _commit(dirs, step, is_best=False, keep_last=3)
    dirs.state_path(dirs.path(20)).unlink()
    choice = dirs.latest(run.path)
    assert choice.step == 10 and "step-00000020" in choice.notice
    dirs.state_path(dirs.path(10)).unlink()
    with pytest.raises(RunDirError, match="no complete checkpoint"):
        dirs.latest(run.path)


def test_fsdp_in_one_process_trains_with_sharded_checkpoints_and_resumes(tmp_path):
    from trainwise.launch.runs import resume_run, train_run

    config = tiny_config(train={"max_steps": 20, "batch_size": 32, "log_every": 5, "strategy": "fsdp"},
                         checkpoint={"every_steps": 5, "keep_last": 10})
    straight = train_run(config, tmp_path / "straight")
    dirs = straight.checkpoint_dirs
    assert dirs.pointer("last") == dirs.path(20) and not straight.checkpoint_path("last").exists()
    # stop a copy at step 10 by hand: drop the newer checkpoints and mark it stopped
    stopped = tmp_path / "stopped"
    shutil.copytree(straight.path, stopped, symlinks=True)
    copy = RunDir(stopped)
    for step, path in copy.checkpoint_dirs.steps():
        if step > 10:
            shutil.rmtree(path)
    copy.write_summary({"status": "stopped"})
    copy.release_writer()
    resumed = resume_run(stopped)  # `last` names a removed step: the newest complete one is used
    fallback = [e for e in resumed.read_events() if e["kind"] == "checkpoint_fallback"]
    assert fallback and "Using step-00000010" in fallback[-1]["message"]
    assert resumed.read_summary()["status"] == "completed"
    a, b = _weights(straight.path), _weights(stopped)
    assert all(a[k].equal(b[k]) for k in a)


# ---- two ranks under torchrun (slow) ---------------------------------------------------------------------
@pytest.mark.slow
def test_fsdp_two_ranks_match_one_process_and_their_checkpoint_loads_in_one(tmp_path, capsys, one_thread):
    single, sharded = tmp_path / "single", tmp_path / "fsdp"
    launcher = start_torchrun("train", *SAME_UPDATE, "train.strategy=fsdp", "--out", str(sharded))
    trained = invoke(capsys, "train", *SAME_UPDATE, "--out", str(single))  # in this process, beside the job
    assert trained.returncode == 0, trained.stderr[-3000:]
    code, output = finish_job(launcher)
    assert code == 0, output[-3000:]
    summary = json.loads((sharded / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 20
    a, b = _weights(single), _weights(sharded)  # model.safetensors is whole, gathered from the shards
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
    # each rank saw half of every batch: the logged loss is the mean over both halves, as in one process
    logged = [[r["loss"] for r in RunDir(run).read_metrics("train")] for run in (single, sharded)]
    assert len(logged[0]) == len(logged[1]) == 4
    torch.testing.assert_close(logged[0], logged[1], rtol=1e-4, atol=1e-6)
    dirs = RunDir(sharded).checkpoint_dirs
    last = dirs.pointer("last")
    assert sorted(p.name for p in last.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]  # each rank's part

    # the 2-rank shards load into a plain model in this one process
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.train.parallel.sharded_checkpoint import load_model

    config = RunDir(sharded).read_config()
    model = build_model(config, build_data(config).spec)
    load_model(model, last)
    assert all(model.state_dict()[k].equal(b[k]) for k in b)

    # and one process resumes the run from step 10 (model and optimizer state resharded) to the same end
    for step, path in dirs.steps():
        if step > 10:
            shutil.rmtree(path)
    writer = RunDir(sharded)
    writer.write_summary({"status": "stopped"})
    writer.release_writer()
    resumed = invoke(capsys, "resume", str(sharded))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    c = _weights(sharded)
    for name in a:
        torch.testing.assert_close(a[name], c[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_sigterm_to_one_rank_stops_both_on_one_step_and_resume_is_bit_identical(tmp_path, strategy):
    args = [*RESUMABLE, f"train.strategy={strategy}"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    uninterrupted = start_torchrun("train", *args, "--out", str(straight))
    launcher = start_torchrun("train", *args, "--out", str(stopped))
    rank1 = _rank_process(launcher, 1)
    _wait_for_step(stopped, 20, launcher)
    rank1.send_signal(signal.SIGTERM)  # only rank 1 sees it: rank 0 learns it at the next settle point
    code, output = finish_job(launcher)
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["status"] == "stopped", output[-3000:]
    step = summary["steps"]
    assert 20 <= step < MAX_STEPS
    assert code != 0  # 75: stopped, resumable
    run = RunDir(stopped)
    if strategy == "fsdp":  # both ranks wrote their shards of the same step, and rank 0 committed them
        last = run.checkpoint_dirs.pointer("last")
        assert last == run.checkpoint_dirs.path(step)
        assert torch.load(last / "trainer.pt", weights_only=True)["step"] == step
    else:
        assert torch.load(run.checkpoint_path("last"), weights_only=True)["step"] == step

    code, output = finish_job(start_torchrun("resume", str(stopped)))
    assert code == 0, output[-3000:]
    code, output = finish_job(uninterrupted)
    assert code == 0, output[-3000:]
    a, b = _weights(straight), _weights(stopped)
    for name in a:
        assert a[name].equal(b[name]), f"{name} differs after resume"
    steps = [r["step"] for r in map(json.loads, (stopped / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]
    assert steps == list(range(1, MAX_STEPS + 1))


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_with_the_rank_named(tmp_path):
    run = tmp_path / "run"
    args = [*RESUMABLE, "train.max_steps=100000", "eval.every_steps=100000", "train.dist_timeout_s=30"]
    launcher = start_torchrun("train", *args, "train.strategy=fsdp", "--out", str(run))
    rank1 = _rank_process(launcher, 1)
    _wait_for_step(run, 16, launcher)  # past the first checkpoint (step 15)
    rank1.send_signal(signal.SIGKILL)
    code, output = finish_job(launcher, timeout=60)  # a job that hangs instead of ending fails here
    assert code != 0
    assert "rank" in output and "1 (local_rank: 1)" in output, output[-3000:]  # torchrun's agent names it
    summary = json.loads((run / "summary.json").read_text())  # rank 0 survived: it says what happened
    assert summary["status"] == "failed" and "rank 1 of this 2-rank job stopped answering" in summary["message"]
    choice = RunDir(run).checkpoint_dirs.latest(run)
    assert choice.step is not None and choice.step >= 15  # the last good checkpoint is intact


def test_early_stopping_restores_the_best_sharded_checkpoint_which_rotation_keeps(tmp_path):
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.launch.runs import train_run
    from trainwise.train.parallel.sharded_checkpoint import load_model

    config = tiny_config(optim={"lr": 0.2}, train={"max_steps": 80, "batch_size": 32, "strategy": "fsdp"},
                         eval={"every_steps": 2, "early_stopping": {"enabled": True, "patience": 2}},
                         checkpoint={"keep_last": 1})
    run = train_run(config, tmp_path / "run")
    summary = run.read_summary()
    assert summary["restored_best"] and summary["best"]["step"] < summary["steps"]
    best = run.checkpoint_dirs.pointer("best")
    assert best == run.checkpoint_dirs.path(summary["best"]["step"])  # older than keep_last=1, still there
    model = build_model(config, build_data(config).spec)
    load_model(model, best)
    final = run.read_model()
    assert all(model.state_dict()[k].equal(final[k]) for k in final)
