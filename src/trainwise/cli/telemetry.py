"""`trainwise monitor`; cli/app.py calls register(app)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
    app.command()(monitor)


def monitor(
    interval: float = typer.Option(2.0, help="Seconds between samples (at least 0.1)."),
    log: Optional[Path] = typer.Option(None, help="Also append every sample to FILE as JSON lines."),
    once: bool = typer.Option(False, "--once", help="Take one sample, show it and exit."),
    as_json: bool = typer.Option(False, "--json", help="Print samples as JSON (one line per sample)."),
) -> None:
    """Watch every GPU (utilisation, memory, temperature, power, SM clock, throttling) and the host, live.
    Without an NVIDIA GPU it shows CPU, RAM and disk."""
    from trainwise.telemetry.monitor import run_monitor

    run_monitor(interval_s=interval, log_path=log, once=once, as_json=as_json)
