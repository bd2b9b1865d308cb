"""`trainwise explain`: read a crash log, say what went wrong and how to fix it.
`trainwise diagnose`: every finding about a run directory, worst first.
`trainwise lr-find`: the learning-rate range test of a recipe."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainwise.errors import ConfigError

STDIN = "-"
# A text log has no NUL bytes and almost no control characters; one in ten means it is not text.
MAX_CONTROL_SHARE = 0.1


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
    from trainwise.diagnose.explain import CATEGORIES

    app.command(epilog="Categories (`category` in --json): " + ", ".join(CATEGORIES) + ".")(explain)
    app.command()(diagnose)
    app.command()(check)
    app.command("lr-find")(lr_find)


SEVERITY_STYLE = {"error": "bold red", "warn": "yellow", "info": "cyan"}


def diagnose(
    run_dir: str = typer.Argument(..., metavar="RUN", help="A run directory written by `trainwise train`."),
    as_json: bool = typer.Option(False, "--json", help='Print one JSON object on one line: {"run", "status", '
                                 '"findings"}, each finding with code, severity, title, detail, evidence, fixes, '
                                 "step; status `interrupted` for a run killed mid-run."),
) -> None:
    """Diagnose a run from its directory: convergence, over/underfitting, slow training, memory leaks and
    GPU hardware, worst first, each with the step, the numbers and the fixes (simplest first). Exit 0 with
    or without findings; 2 when RUN is not a run directory or has no metrics yet."""
    from trainwise.findings import worst_first
    from trainwise.diagnose.run_rules import diagnose_run
    from trainwise.rundir.layout import RunDir

    run = RunDir.open(run_dir)
    findings = diagnose_run(run)
    status = run.status()
    state = _run_state_finding(run, status)
    findings = worst_first([state, *findings]) if state else findings
    if as_json:
        print(json.dumps(_finite({"run": str(run_dir), "status": status, "findings": [f.to_dict() for f in findings]}),
                         allow_nan=False))
        return
    console = Console()
    if state is not None:  # first, whole (a path is not folded): the resume command is copied from here
        console.print(Text(state.detail, style="bold yellow" if status == "interrupted" else "bold"), soft_wrap=True)
    if not findings:
        console.print(Text(f"{run_dir}: no findings: the curves, throughput, memory and GPUs look healthy."))
        return
    table = Table("severity", "code", "step", "finding", "first fix", box=None, header_style="bold")
    for f in findings:
        table.add_row(Text(f.severity, style=SEVERITY_STYLE[f.severity]), Text(f.code),
                      "" if f.step is None else str(f.step), Text(f"{f.title}\n{f.detail}"),
                      Text(f.fixes[0] if f.fixes else ""))
    console.print(table)
    console.print(Text(f"{len(findings)} finding(s); `trainwise diagnose {run_dir} --json` gives the evidence "
                       "and every fix.", style="dim"))


def _run_state_finding(run, status: str):
    """A finding for a run that is still training (info) or was interrupted (warn, with the resume command)."""
    from trainwise.findings import Finding

    note = run.liveness_note()
    if note is None or status not in ("running", "interrupted"):
        return None
    summary = run.read_summary()
    evidence = {"status": status, "steps": summary.get("steps"), "max_steps": summary.get("max_steps"),
                "last_checkpoint_step": summary.get("last_checkpoint_step"), "updated": summary.get("updated")}
    if status == "running":
        return Finding("run_in_progress", "info", "The run is still training", note, evidence, step=evidence["steps"])
    fix = (f"trainwise resume {run.path}" if run.has_checkpoint()  # killed before its first checkpoint: start over
           else f"trainwise train RECIPE --out {run.path} --overwrite")
    return Finding("run_interrupted", "warn", "The run was interrupted (killed or crashed mid-run)", note, evidence,
                   fixes=(fix,), step=evidence["steps"])


def check(
    recipe: str = typer.Argument(..., help="A built-in recipe name (see `trainwise recipes`) or a YAML file."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides of the recipe, e.g. "
                                                    "optim.lr=3e-4."),
    as_json: bool = typer.Option(False, "--json", help='Print one JSON object on one line: {"recipe", "findings"}.'),
) -> None:
    """Sanity-check a recipe before training: labels per split (missing classes, one class, extreme
    imbalance), inputs (NaN/Inf, constant features, unnormalised scale, rows duplicated between train and
    test) and an overfit-one-batch probe of the model, loss and optimizer. Exit 0 when nothing is an error,
    1 when something is (do not train yet), 2 on bad input."""
    from trainwise.check.sanity import sanity_check
    from trainwise.recipes import load_recipe

    findings = sanity_check(load_recipe(recipe, overrides or []))
    if as_json:
        print(json.dumps(_finite({"recipe": recipe, "findings": [f.to_dict() for f in findings]}), allow_nan=False))
    else:
        _print_findings(Console(), findings)
    if any(f.severity == "error" for f in findings):
        raise typer.Exit(1)


def _print_findings(console: Console, findings) -> None:
    table = Table("severity", "code", "finding", "first fix", box=None, header_style="bold")
    for f in findings:
        table.add_row(Text(f.severity, style=SEVERITY_STYLE[f.severity]), Text(f.code),
                      Text(f"{f.title}\n{f.detail}"), Text(f.fixes[0] if f.fixes else ""))
    console.print(table)


def _finite(value):
    """NaN/Inf as strings (a NaN loss is evidence): strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def lr_find(
    recipe: str = typer.Argument(..., help="A built-in recipe name (see `trainwise recipes`) or a YAML file."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides of the recipe, e.g. "
                                                    "optim.name=sgd train.batch_size=64."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for lr_find.json and lr_find.png."),
    overwrite: bool = typer.Option(False, help="Write into an existing, non-empty --out."),
    min_lr: float = typer.Option(1e-6, help="First learning rate of the sweep."),
    max_lr: float = typer.Option(1.0, help="Last learning rate, reached only if the loss never diverges."),
    steps: Optional[int] = typer.Option(None, help="Steps of the sweep (default: 8 epochs, 50 to 100)."),
) -> None:
    """Find a learning rate: train a copy of the recipe's model while raising the rate exponentially from
    --min-lr to --max-lr, stop when the smoothed loss diverges, and suggest the rate at the loss's minimum
    divided by 10, with the override to use. Writes lr_find.json (the curve) and lr_find.png into --out;
    nothing else. Exit 2 on bad input (a non-empty --out, a recipe without a loss), with nothing written."""
    from trainwise.check import lr_find as finder
    from trainwise.diagnose import lr_curve
    from trainwise.recipes import load_recipe

    settings = lr_curve.SweepSettings(min_lr=min_lr, max_lr=max_lr, steps=steps)
    settings.check()
    config = load_recipe(recipe, overrides or [])
    finder.refuse_out_dir(out, overwrite=overwrite, config=config)  # fail fast, before the sweep
    result = finder.lr_find_config(config, settings)
    json_path, png_path = finder.write_outputs(result, out)
    console = Console()
    console.print(Text.assemble(("suggested learning rate: ", "bold"), f"{result.suggestion:.3g}   ",
                                ("override: ", "bold"), result.override))
    stop = "stopped at divergence" if result.diverged else "no divergence"
    console.print(Text(f"{len(result.lrs)} of {result.steps_planned} steps, lr {result.lrs[0]:.2g} to "
                       f"{result.lrs[-1]:.3g} ({stop}); rule: {result.rule}.", style="dim"))
    if result.note:
        console.print(Text("note: " + result.note, style="yellow"))
    console.print(Text(f"curve: {json_path}  plot: {png_path}"))
    console.print(Text(f"train with it: trainwise train {recipe} {' '.join(overrides or [])} "
                       f"{result.override} --out runs/NAME".replace("  ", " ")))


def explain(
    logfile: Optional[str] = typer.Argument(None, metavar="LOGFILE|-",
                                            help="The log of the failed run; `-` or nothing reads standard input."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on one line: category, title, "
                                 "cause, fixes, evidence."),
) -> None:
    """Read a crash log and name the root cause: category, the cause in plain words, the fixes (simplest
    first) and the log lines that show it. Reads the whole log, so the first failure wins over the errors
    it caused later (e.g. one rank's OOM over the other ranks' NCCL timeouts)."""
    from trainwise.diagnose.explain import explain as explain_text

    source = logfile or STDIN
    finding = explain_text(_read_log(source))
    if as_json:
        print(json.dumps({"category": finding.code, "title": finding.title, "cause": finding.detail,
                          "fixes": list(finding.fixes), "evidence": finding.evidence["lines"]}))
    else:
        _print_finding(Console(), finding)


def _read_log(source: str) -> str:
    """The log as text; a ConfigError (exit 2, one line) when it is missing, empty or not text."""
    name = "standard input" if source == STDIN else source
    if source == STDIN:
        if sys.stdin is None or sys.stdin.isatty():
            raise ConfigError("no log given: pass LOGFILE (save one with `python train.py 2>&1 | tee run.log`) "
                              "or pipe it in: `trainwise explain - < run.log`.")
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "replace")
    else:
        data = _read_log_file(Path(source))
    if not data.strip():
        raise ConfigError(f"{name} is empty: give the log of the failed run (stdout and stderr, `2>&1`).")
    text = data.decode("utf-8", errors="replace")
    controls = sum(1 for ch in text if ch < " " and ch not in "\t\n\r\x1b\f\v") + text.count("\ufffd")
    if b"\x00" in data or controls > MAX_CONTROL_SHARE * len(text):
        raise ConfigError(f"{name} is not a text log (binary data): give the log of the failed run.")
    return text


def _read_log_file(path: Path) -> bytes:
    """A regular file, or a pipe (`trainwise explain <(cat log)`, a FIFO): read to the end. Anything else (a
    directory, a device) is refused: reading /dev/zero would never end."""
    import stat

    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"{path} is a directory: give the log file of the failed run.")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise ConfigError(f"{path} is not a regular file or a pipe; give the log file, or pipe the log in with "
                              f"`-`: `trainwise explain - < run.log`.")
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file.") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e}).") from None


def _print_finding(console: Console, finding) -> None:
    # Log lines go in as Text, never as markup: "[rank0]:" and "[E321 ...]" would read as Rich tags.
    style = "bold yellow" if finding.code == "unknown" else "bold red"
    console.print(Text.assemble((finding.code, style), "  ", (finding.title, "bold")))
    console.print(Text(finding.detail))
    rows = [("fixes:", [(f"{number}.", fix) for number, fix in enumerate(finding.fixes, start=1)]),
            ("evidence:", [(f"line {line['line']}:", line["text"]) for line in finding.evidence.get("lines", [])])]
    for heading, items in rows:
        if items:
            console.print(Text(heading, style="bold"))
            table = Table.grid(padding=(0, 1))   # wrapped text stays right of the number
            table.add_column(style="dim", justify="right", no_wrap=True)
            table.add_column(overflow="fold")
            for label, text in items:
                table.add_row(Text("  " + label), Text(text))
            console.print(table)
