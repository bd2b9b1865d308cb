"""`trainwise doctor`: check the Python/PyTorch/driver stack, the data disk and the GPUs, and say how to fix
what is wrong."""
from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]"}


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
    app.command()(doctor)


def doctor(
    data_dir: Path = typer.Option(Path("."), "--data-dir", help="Where the training data will live."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as a JSON list."),
    record: Optional[Path] = typer.Option(None, help="Also save this machine's facts to FILE (JSON), to share "
                                          "or to check elsewhere with --facts."),
    facts_file: Optional[Path] = typer.Option(None, "--facts", help="Check facts recorded with --record instead "
                                              "of this machine."),
    temperature_warn: Optional[float] = typer.Option(None, help="GPU temperature (°C) that is a warning "
                                                     "(default: telemetry.temperature_warn_c, as in training)."),
    temperature_fail: Optional[float] = typer.Option(None, help="GPU temperature (°C) that is a failure "
                                                     "(default: telemetry.temperature_fail_c, as in training)."),
) -> None:
    """Check the software stack (Python, PyTorch, driver, CUDA), then the hardware (data disk, host, GPU health).
    Every problem comes with its fix. Exits 1 when a check fails."""
    from trainwise.doctor.checks import run_checks
    from trainwise.doctor.facts import collect_facts, load_facts, save_facts
    from trainwise.doctor.findings import worst
    from trainwise.telemetry.alerts import thresholds_from

    given = {"temperature_warn_c": temperature_warn, "temperature_fail_c": temperature_fail}
    thresholds = thresholds_from(**{k: v for k, v in given.items() if v is not None})  # defaults: TelemetryConfig
    console = Console()
    if facts_file is not None:
        facts = load_facts(facts_file)
    else:
        with console.status("probing the machine (torch, NVML, pip check) ...") if not as_json else nullcontext():
            facts = collect_facts(data_dir)
    if record is not None:
        save_facts(facts, record)
    findings = run_checks(facts, thresholds)
    if as_json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        _print_findings(console, findings, _header(facts, facts_file))
        if record is not None:
            console.print(f"facts saved to {record}")
    if worst(findings) == "fail":
        raise typer.Exit(1)


LIVE_PREFIX = "Recorded by trainwise doctor: "  # how collect_facts describes a machine, for a later --facts


def _header(facts, facts_file: Optional[Path]) -> str:
    """Which machine the findings are about: this one, probed now, or the one a facts file recorded."""
    description = facts.description.removeprefix(LIVE_PREFIX)
    if facts_file is None:
        return f"This machine: {description}"
    when = f", recorded {facts.recorded_at}" if facts.recorded_at else ""
    return f"Facts from {facts_file}{when}: {description}"


def _print_findings(console: Console, findings, description: str) -> None:
    if description:
        console.print(f"[bold]{description}[/]")
    table = Table(box=None, show_header=False, padding=(0, 1))
    for f in findings:
        table.add_row(STYLE[f.status], f"[bold]{f.title}[/]", f.finding)
        if f.fix and f.status != "ok":
            table.add_row("", "", f"[cyan]fix:[/] {f.fix}")
    console.print(table, soft_wrap=False)
    counts = {s: sum(f.status == s for f in findings) for s in STYLE}
    console.print(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail")

