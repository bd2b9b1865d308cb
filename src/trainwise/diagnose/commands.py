"""`trainwise explain`: read a crash log, say what went wrong and how to fix it."""
from __future__ import annotations

import json
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
        path = Path(source)
        if path.is_dir():
            raise ConfigError(f"{name} is a directory: give the log file of the failed run.")
        if not path.is_file():
            raise ConfigError(f"{name}: no such file.")
        data = path.read_bytes()
    if not data.strip():
        raise ConfigError(f"{name} is empty: give the log of the failed run (stdout and stderr, `2>&1`).")
    text = data.decode("utf-8", errors="replace")
    controls = sum(1 for ch in text if ch < " " and ch not in "\t\n\r\x1b\f\v") + text.count("\ufffd")
    if b"\x00" in data or controls > MAX_CONTROL_SHARE * len(text):
        raise ConfigError(f"{name} is not a text log (binary data): give the log of the failed run.")
    return text


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
