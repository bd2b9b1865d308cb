"""Telemetry in a real (tiny) training run: the trainer attaches it when telemetry.enabled."""
import threading

import pytest

from trainwise.recipes import load_recipe
from trainwise.launch.runs import train_run

SHORT = ["train.max_steps=12", "schedule.warmup_steps=2", "train.log_every=4", "eval.every_steps=12",
         "telemetry.interval_s=0.1"]


@pytest.mark.slow
def test_training_writes_system_jsonl_and_stops_the_sampler(tmp_path):
    run = train_run(load_recipe("digits", SHORT), tmp_path / "run")
    samples = run.read_system()
    assert samples and all("cpu_percent" in s and "gpus" in s for s in samples)
    assert {s["step"] for s in samples} <= set(range(0, 13))
    assert run.read_summary()["status"] == "completed"
    assert not [t for t in threading.enumerate() if t.name == "trainwise-telemetry"]


@pytest.mark.slow
def test_disabled_telemetry_writes_nothing(tmp_path):
    run = train_run(load_recipe("digits", [*SHORT, "telemetry.enabled=false"]), tmp_path / "run")
    assert run.read_system() == [] and not run.system_path.exists()
