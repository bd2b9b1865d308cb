"""Exact resume: a run killed with SIGKILL and resumed ends with the same weights, bit for bit."""
import json

import pytest
from safetensors.torch import load_file

from tests.conftest import invoke, straight_and_killed
from trainwise.train.parallel.sampler import ResumableBatchSampler

# dropout + augmentation exercise the RNG; checkpoints every 7 steps land at odd places
ARGS = ["digits", "train.max_steps=90", "train.log_every=1", "eval.every_steps=20",
        "checkpoint.every_steps=7", "eval.early_stopping.enabled=false", "telemetry.enabled=false",
        "train.batch_size=32", "train.micro_batch_size=16", "model.args.channels=[8,16]", "model.args.hidden=32"]


def _last_logged_step(run_dir):
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]
    return max(steps, default=0)


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(tmp_path, capsys, one_thread):
    straight, killed, _ = straight_and_killed(capsys, ARGS, tmp_path, _last_logged_step, range(45, 90))
    assert json.loads((killed / "summary.json").read_text())["status"] == "running"

    resumed = invoke(capsys, "resume", str(killed))
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), f"{name} differs after resume"
    # the curve is continuous: every step logged once
    steps = [r["step"] for r in map(json.loads, (killed / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]
    assert steps == list(range(1, 91))


def test_sampler_resumes_at_any_position_without_replay():
    sampler = ResumableBatchSampler(100, 8, 12, seed=3)
    sampler.set_position(2, 0)
    whole_epoch = list(sampler)
    sampler.set_position(2, 5)
    assert list(sampler) == whole_epoch[5:]
    sampler.set_position(3, 0)
    assert list(sampler) != whole_epoch  # a new order each epoch
    assert len({i for batch in whole_epoch for i in batch}) == 96  # no sample twice in an epoch
