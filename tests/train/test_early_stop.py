import torch

from tests.conftest import tiny_config
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import read_checkpoint
from trainwise.train.callbacks.early_stop import EarlyStopping
from trainwise.launch.runs import build_trainer, resume_run


def test_patience_and_min_delta_in_both_directions():
    stop = EarlyStopping("min", patience=2, min_delta=0.1)
    assert stop.update(1.0, 1)
    assert not stop.update(0.95, 2)  # not better by min_delta
    assert not stop.should_stop
    assert not stop.update(0.99, 3)
    assert stop.should_stop and stop.best == 1.0 and stop.best_step == 1
    up = EarlyStopping("max", patience=1)
    assert up.update(0.5, 1) and up.update(0.6, 2) and not up.update(0.6, 3)
    assert up.should_stop


def test_state_round_trips():
    stop = EarlyStopping("max", patience=3)
    stop.update(0.7, 10)
    stop.update(0.6, 20)
    again = EarlyStopping("max", patience=3)
    again.load_state_dict(stop.state_dict())
    assert again.state_dict() == stop.state_dict() == {"best": 0.7, "best_step": 10, "evals_without_improvement": 1}


def _overfitting_config(**train):
    # a high LR on a tiny split overfits fast: val loss turns up within a few evaluations
    return tiny_config(optim={"lr": 0.05}, train={"max_steps": 200, "log_every": 10, **train},
                       model={"name": "mlp", "args": {"hidden": [128, 128], "dropout": 0.0}},
                       eval={"every_steps": 5, "monitor": "val/loss",
                             "early_stopping": {"enabled": True, "patience": 3}})


def test_stops_early_and_restores_the_best_weights(tmp_path):
    run = RunDir(tmp_path / "run")
    trainer = build_trainer(_overfitting_config(), run)
    run.initialise()
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["steps"] < 200
    assert summary["restored_best"]
    best = read_checkpoint(run.checkpoint_path("best"))
    assert best["step"] == summary["best"]["step"] < summary["steps"]
    final = run.read_model()
    for name, tensor in best["model"].items():
        assert torch.equal(final[name], tensor)
    assert any(e["kind"] == "early_stop" for e in run.read_events())


def test_early_stopping_state_survives_resume(tmp_path):
    run = RunDir(tmp_path / "run")

    class StopAt(__import__("trainwise.train.callbacks.base", fromlist=["Callback"]).Callback):
        def on_step_end(self, trainer):
            if trainer.step == 15:
                trainer.request_stop("test")

    trainer = build_trainer(_overfitting_config(), run, [StopAt()])
    run.initialise()
    trainer.fit()
    saved = read_checkpoint(run.checkpoint_path("last"))["early_stopping"]
    assert saved == trainer.early_stopping.state_dict() and saved["best"] is not None

    straight = RunDir(tmp_path / "straight")
    reference = build_trainer(_overfitting_config(), straight)
    straight.initialise()
    reference_summary = reference.fit()
    resume_run(run.path)
    assert run.read_summary()["steps"] == reference_summary["steps"]
    assert run.read_summary()["best"] == reference_summary["best"]
