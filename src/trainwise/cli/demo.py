"""`trainwise demo`: the main job end to end on the bundled digits — train, evaluate on the held-out test
split, write the report — and say where everything is."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from trainwise.recipes import load_recipe
from trainwise.rundir.layout import RunDir
from trainwise.launch.runs import train_run


def demo_run(out: str | Path, *, overwrite: bool = False, console: Console | None = None) -> RunDir:
    """Train, evaluate and report. A run stopped by a signal is left as it is (resumable), not evaluated:
    its summary says `stopped`, and the caller says so."""
    console = console or Console()
    config = load_recipe("digits")
    run = train_run(config, out, overwrite=overwrite)
    if run.read_summary().get("status") != "completed":
        return run
    from trainwise.evaluate.run_eval import evaluate_run
    from trainwise.evaluate.report import write_report

    metrics = evaluate_run(run, split="test", checkpoint="best")
    report = write_report(run, fmt="html")
    summary = run.read_summary()
    console.print(f"[bold]digits[/]: {summary['steps']} steps in {summary['timings']['wall_s']:.1f} s on "
                  f"{summary['device']} ({summary['precision']})")
    console.print(f"test accuracy {metrics['accuracy']:.2%} (balanced {metrics['balanced_accuracy']:.2%}) "
                  f"on {metrics['samples']} held-out images")
    console.print(f"run directory: {run.path}\nreport:        {report}")
    return run
