"""`make demo` says it stopped early and which step's weights it kept, as the report does (issue 26)."""
import trainwise.cli.demo as demo_module
from tests.conftest import invoke
from trainwise.recipes import load_recipe

SMALL = ["train.max_steps=200", "schedule.warmup_steps=2", "eval.every_steps=10", "train.log_every=10",
         "telemetry.enabled=false", "model.args.channels=[4,8]", "model.args.hidden=16", "optim.lr=1e-9",
         "eval.early_stopping.enabled=true", "eval.early_stopping.patience=2"]


def test_the_demo_says_it_stopped_early_and_which_step_it_restored(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(demo_module, "load_recipe", lambda name: load_recipe(name, SMALL))
    result = invoke(capsys, "demo", "--out", str(tmp_path / "demo"))
    assert result.returncode == 0, result.stderr[-2000:]
    said = result.stdout + result.stderr
    assert "stopped early at step" in said and "best step" in said and "restored" in said
