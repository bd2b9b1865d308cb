"""What the report lists among the warnings, the terminal says in one line each (issue 26)."""
import io
from types import SimpleNamespace

from rich.console import Console

from trainwise.findings import Finding
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.live_diagnosis import SanityFindings
from trainwise.train.loop.progress import ProgressDisplay


def _trainer(tmp_path, step=0):
    return SimpleNamespace(run_dir=RunDir.create(tmp_path / "r"), step=step, max_steps=10, epoch=0, device="cpu",
                           precision="fp32", ranks=SimpleNamespace(is_main=True))


def test_sanity_warnings_are_said_before_the_first_step(tmp_path):
    out = io.StringIO()
    trainer = _trainer(tmp_path)
    finding = Finding("overfit_probe_slow", "warn", "one batch is not memorised: loss still 97% of its start", "")
    SanityFindings([finding], console=Console(file=out, width=200)).on_fit_start(trainer)
    assert "warning: one batch is not memorised" in out.getvalue()
    assert [e["kind"] for e in trainer.run_dir.read_events()] == ["sanity"]


def test_warnings_recorded_during_training_are_said_at_the_end_once(tmp_path):
    out = io.StringIO()
    trainer = _trainer(tmp_path)
    display = ProgressDisplay(Console(file=out, width=200, force_terminal=False))
    display.on_fit_start(trainer)
    trainer.run_dir.log_event("best_damaged", "checkpoints/best.pt is damaged; the last one was kept",
                              severity="warning", step=7)
    trainer.run_dir.log_event("diagnosis", "train loss is flat", severity="warning", step=5)  # said live already
    display.on_fit_end(trainer, {"status": "completed"})
    text = out.getvalue()
    assert "warning step 7: checkpoints/best.pt is damaged" in text and "flat" not in text
