"""`train.micro_batch_size: auto`: the largest divisor of the per-rank batch whose planned peak fits the memory
free on the device less a margin; the choice and its numbers are an event, config.yaml records the number."""
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, tiny_config
from tests.conftest import finish_job
from trainwise.errors import ConfigError
from trainwise.plan import auto_micro_batch
from trainwise.plan.auto_micro_batch import EVENT_KIND, choose_micro_batch, resolve_micro_batch
from trainwise.rundir.layout import RunDir
from trainwise.launch.runs import train_run


def _auto_config(micro_batch_size="auto", **sections):
    return tiny_config(train={"micro_batch_size": micro_batch_size, "max_steps": 6, "batch_size": 32, "log_every": 3,
                              "device": "cpu", "sanity": False},
                       data={"num_workers": 0, **sections.pop("data", {})},
                       eval={"every_steps": None, "every_epoch": False}, **sections)


def test_choose_takes_the_largest_divisor_that_fits():
    def peak(m):
        return 1000 + 100 * m  # bytes: fixed part + activations per sample

    assert choose_micro_batch(peak, 48, budget=1000 + 100 * 48) == (48, None, True)
    assert choose_micro_batch(peak, 48, budget=1000 + 100 * 20) == (16, 24, True)  # 20 does not divide 48
    assert choose_micro_batch(peak, 48, budget=1000 + 100 * 16 - 1) == (12, 16, True)
    assert choose_micro_batch(peak, 7, budget=1000 + 100 * 6) == (1, 7, True)  # a prime batch: 1 or all
    assert choose_micro_batch(peak, 48, budget=500) == (1, 2, False)  # nothing fits: start at 1, say so


def test_auto_on_the_cpu_fits_host_ram_and_trains_end_to_end(tmp_path):
    run = train_run(_auto_config(), tmp_path / "run")
    summary = run.read_summary()
    assert summary["status"] == "completed" and summary["steps"] == 6
    recorded = yaml.safe_load(run.config_path.read_text())["train"]["micro_batch_size"]
    assert isinstance(recorded, int) and 32 % recorded == 0  # the number, so a resume keeps it
    [event] = [e for e in run.read_events() if e["kind"] == EVENT_KIND]
    evidence = event["evidence"]
    assert evidence["micro_batch_size"] == recorded and evidence["device"] == "cpu"
    assert evidence["free_bytes"] > 0 and evidence["margin_bytes"] > 0
    assert evidence["budget_bytes"] == evidence["free_bytes"] - evidence["margin_bytes"] - evidence["fixed_bytes"]
    assert 0 < evidence["estimated_peak_bytes"] <= evidence["budget_bytes"]
    assert f"auto -> {recorded}" in event["message"] and "MiB free on cpu" in event["message"]
    # a few MiB model on a machine with GiBs free: the whole per-rank batch fits
    assert recorded == 32 and evidence["next_micro_batch_size"] is None


def test_little_free_memory_picks_a_smaller_micro_batch(tmp_path, monkeypatch):
    from trainwise.plan.job import estimate_job, job_from_config

    # a small CNN: its activations, unlike a small MLP's, outweigh the optimizer's state
    cnn = {"model": {"name": "cnn", "args": {"channels": [16, 32], "hidden": 32, "dropout": 0.0}},
           "data": {"name": "digits", "augment": False}}
    config = _auto_config(**cnn)
    memory = estimate_job(job_from_config(_auto_config(None, **cnn), "cpu"), ("cpu",)).memory["cpu"]
    peak = {size: memory.peak_bytes(size) for size in (8, 16, 32)}
    assert peak[8] < peak[16] < peak[32], "the estimate must grow with the micro-batch for this test to mean anything"
    total = 10 * peak[32]
    margin = int(auto_micro_batch.SAFETY_MARGIN * total)
    monkeypatch.setattr(auto_micro_batch, "free_memory_bytes", lambda device: (margin + peak[8] + 1, total))
    run = train_run(config, tmp_path / "run")
    [event] = [e for e in run.read_events() if e["kind"] == EVENT_KIND]
    evidence = event["evidence"]
    assert evidence["micro_batch_size"] == 8 and evidence["free_bytes"] == margin + peak[8] + 1
    assert evidence["estimated_peak_bytes"] == peak[8] <= evidence["budget_bytes"] < peak[16]
    assert evidence["next_micro_batch_size"] == 16 and evidence["next_estimated_peak_bytes"] == peak[16]
    assert "the next size, 16" in event["message"]
    assert yaml.safe_load(run.config_path.read_text())["train"]["micro_batch_size"] == 8
    summary = run.read_summary()
    assert summary["status"] == "completed" and summary["steps"] == 6  # 8 × 4 accumulated: 32-sample steps
    [started] = [e for e in run.read_events() if e["kind"] == "started"]
    assert started["evidence"]["accumulation_steps"] == 4


def test_nothing_fits_starts_at_one_with_a_warning(monkeypatch):
    monkeypatch.setattr(auto_micro_batch, "free_memory_bytes", lambda device: (1000, 1000))
    config, choice = resolve_micro_batch(_auto_config())
    assert config.train.micro_batch_size == 1 and not choice.fits
    assert choice.event()["severity"] == "warning" and "even micro-batch 1" in choice.message()


def test_auto_without_the_planner_says_how_to_get_it(tmp_path):
    """The engine built directly (not through launch/'s resolve step) cannot plan: it says who does."""
    from trainwise.launch.runs import build_trainer

    with pytest.raises(ConfigError, match="train_run"):
        build_trainer(_auto_config(), RunDir(tmp_path / "run"))
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_on_a_card_at_most_two_real_steps_confirm_the_choice(monkeypatch):
    """The CUDA confirmation, with the real step replaced by a card that holds `limit` samples."""
    from trainwise.plan.auto_micro_batch import MAX_PROBE_STEPS, _confirm_on_card

    def card_holding(limit):
        return lambda step, device: step.micro_batch_size <= limit

    monkeypatch.setattr(auto_micro_batch, "_one_real_step", card_holding(16))
    assert _confirm_on_card(_step(), "cuda", 16, 48) == (16, ((16, True),))
    monkeypatch.setattr(auto_micro_batch, "_one_real_step", card_holding(12))
    assert _confirm_on_card(_step(), "cuda", 16, 48) == (12, ((16, False), (12, True)))
    monkeypatch.setattr(auto_micro_batch, "_one_real_step", card_holding(2))
    size, probes = _confirm_on_card(_step(), "cuda", 16, 48)  # unconfirmed: the Trainer's recovery goes on
    assert len(probes) == MAX_PROBE_STEPS == 2 and size == 8 and probes == ((16, False), (12, False))


def _step():
    from torch import nn

    from trainwise.plan.traced_step import TrainingStep

    return TrainingStep(build_model=lambda: nn.Linear(4, 2), input_shape=(4,), num_classes=2)


AUTO_UNDER_TORCHRUN = """
import sys
from tests.plan.test_auto_micro_batch import _auto_config
from trainwise.launch.runs import train_run
config = _auto_config()
config = config.model_copy(update={"train": config.train.model_copy(update={"strategy": "ddp"})})
train_run(config, sys.argv[1])
"""


@pytest.mark.slow
def test_under_torchrun_every_rank_takes_the_smallest_choice(tmp_path):
    script = tmp_path / "auto_ddp.py"
    script.write_text(AUTO_UNDER_TORCHRUN)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(script), str(tmp_path / "run")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    code, output = finish_job(proc, timeout=240)
    assert code == 0, output[-3000:]
    run = RunDir(tmp_path / "run")
    [event] = [e for e in run.read_events() if e["kind"] == EVENT_KIND]
    assert event["evidence"]["ranks_agreed"] == 2 and event["evidence"]["per_rank_batch"] == 16
    assert yaml.safe_load(run.config_path.read_text())["train"]["micro_batch_size"] == 16
    assert run.read_summary()["status"] == "completed"
