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

# a Finding's severity in the doctor's words: info is a check that passed (or a fact worth knowing)
STYLE = {"info": "[green]ok[/]", "warn": "[yellow]warn[/]", "error": "[bold red]fail[/]"}
WORD = {"info": "ok", "warn": "warn", "error": "fail"}


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
    app.command()(doctor)


def doctor(
    data_dir: Path = typer.Option(Path("."), "--data-dir", help="Where the training data will live."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as a JSON list of finding records "
                                 "({code, severity: info|warn|error, title, detail, evidence, fixes, step})."),
    record: Optional[Path] = typer.Option(None, help="Also save this machine's facts to FILE (JSON), to share "
                                          "or to check elsewhere with --facts."),
    facts_file: Optional[Path] = typer.Option(None, "--facts", help="Check facts recorded with --record instead "
                                              "of this machine."),
    temperature_warn: Optional[float] = typer.Option(None, help="GPU temperature (°C) that is a warning "
                                                     "(default: telemetry.temperature_warn_c, as in training)."),
    temperature_fail: Optional[float] = typer.Option(None, help="GPU temperature (°C) that is a failure "
                                                     "(default: telemetry.temperature_fail_c, as in training)."),
    nproc: Optional[int] = typer.Option(None, "--nproc", min=1, help="Also check for a job of N ranks on this "
                                        "machine: visible GPUs, NCCL/InfiniBand settings, /dev/shm for every "
                                        "rank's DataLoader workers. Automatic inside a launched job."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", min=1, help="Machines in that job (default 1; "
                                         "inside a launched job, from WORLD_SIZE / LOCAL_WORLD_SIZE)."),
    num_workers: Optional[int] = typer.Option(None, "--num-workers", min=0, help="DataLoader workers per rank "
                                              "(default: what data.num_workers=auto picks)."),
) -> None:
    """Check the software stack (Python, PyTorch, driver, CUDA), then the hardware (data disk, host, GPU health),
    then, with --nproc or inside a torchrun/srun job, the multi-GPU setup. Every problem comes with its fix.
    Exits 1 when a check fails."""
    from trainwise.doctor.checks import run_checks
    from trainwise.doctor.distributed_facts import with_job
    from trainwise.doctor.facts import collect_facts, load_facts, save_facts
    from trainwise.findings import worst
    from trainwise.telemetry.alerts import thresholds_from

    given = {"temperature_warn_c": temperature_warn, "temperature_fail_c": temperature_fail}
    thresholds = thresholds_from(**{k: v for k, v in given.items() if v is not None})  # defaults: TelemetryConfig
    console = Console()
    if facts_file is not None:
        facts = load_facts(facts_file)
        facts.distributed = with_job(facts.distributed, nproc, nnodes, num_workers)
    else:
        with console.status("probing the machine (torch, NVML, pip check) ...") if not as_json else nullcontext():
            facts = collect_facts(data_dir, nproc=nproc, nnodes=nnodes, num_workers=num_workers)
    if record is not None:
        save_facts(facts, record)
    findings = run_checks(facts, thresholds)
    if as_json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        _print_findings(console, findings, _header(facts, facts_file))
        if record is not None:
            console.print(f"facts saved to {record}")
    if worst(findings) == "error":
        raise typer.Exit(1)


LIVE_PREFIX = "Recorded by trainwise doctor: "  # how collect_facts describes a machine, for a later --facts


def _header(facts, facts_file: Optional[Path]) -> str:
    """Which machine the findings are about: this one, probed now, or the one a facts file recorded."""
    description = facts.description.removeprefix(LIVE_PREFIX)
    job = facts.distributed
    if job is not None and job.in_job and job.rank is not None:
        description += f" (rank {job.rank} of {job.world_size} in a launched job)"
    if facts_file is None:
        return f"This machine: {description}"
    when = f", recorded {facts.recorded_at}" if facts.recorded_at else ""
    return f"Facts from {facts_file}{when}: {description}"


def _print_findings(console: Console, findings, description: str) -> None:
    if description:
        console.print(f"[bold]{description}[/]")
    table = Table(box=None, show_header=False, padding=(0, 1))
    for f in findings:
        table.add_row(STYLE[f.severity], f"[bold]{f.title}[/]", f.detail)
        if f.severity != "info":
            for fix in f.fixes:
                table.add_row("", "", f"[cyan]fix:[/] {fix}")
    console.print(table, soft_wrap=False)
    counts = {severity: sum(f.severity == severity for f in findings) for severity in STYLE}
    console.print(", ".join(f"{counts[severity]} {WORD[severity]}" for severity in STYLE))

