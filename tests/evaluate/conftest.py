"""Shared fixtures: a hand-made run directory (no training) and a tiny real run (trained once per session)."""
from __future__ import annotations

import pytest

from tests.evaluate.fake_run import make_fake_run
from trainwise.recipes import load_recipe
from trainwise.rundir.layout import RunDir

TINY = ["train.max_steps=30", "eval.every_steps=10", "telemetry.enabled=false", "train.log_every=5"]


@pytest.fixture
def fake_run(tmp_path) -> RunDir:
    return make_fake_run(tmp_path / "run")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> RunDir:
    """breast-cancer for 30 steps on the CPU: real checkpoints, metrics and model (a few seconds)."""
    from trainwise.launch.runs import train_run

    return train_run(load_recipe("breast-cancer", TINY), tmp_path_factory.mktemp("runs") / "bc")
