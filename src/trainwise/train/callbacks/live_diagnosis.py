"""Diagnosis while training: the rules of `trainwise diagnose`, run on what the loop has logged so far.

A finding is written to events.jsonl (and shown at the terminal) the first time its code appears, with
the step and the numbers, so a loss that has stopped falling or a starved loader is named while there is
still time to stop the run. The same pure rules judge the finished run directory, so the live verdict and
the final one cannot disagree.
"""
from __future__ import annotations

from typing import Any

from rich.console import Console

from trainwise.train.callbacks.base import Callback
from trainwise.train.loop.progress import TrainingConsole

# The rules re-read the whole window each time (a flat loss is measured from where it started), so the
# checks thin out as the run grows: every 5 log lines, then every 5% of the lines so far. A long run pays
# O(n log n) for them, not O(n²).
CHECK_EVERY_LOGS = 5
CHECK_SHARE_OF_LOGS = 20


class LiveDiagnosis(Callback):
    def __init__(self, console: Console | None = None):
        self.console = console or TrainingConsole()
        self.records: list[dict[str, Any]] = []
        self.reported: set[str] = set()
        self.logs = 0

    def on_fit_start(self, trainer) -> None:
        self.records = trainer.run_dir.read_metrics()  # a resumed run keeps its whole curve in view
        self.reported = {e.get("evidence", {}).get("code") for e in trainer.run_dir.read_events()
                         if e.get("kind") == "diagnosis" and isinstance(e.get("evidence"), dict)}

    def on_log(self, trainer, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.logs += 1
        if self.logs % max(CHECK_EVERY_LOGS, self.logs // CHECK_SHARE_OF_LOGS) == 0:
            self._check(trainer)

    def on_eval(self, trainer, record: dict[str, Any]) -> None:
        self.records.append(record)
        self._check(trainer)

    def _check(self, trainer) -> None:
        from trainwise.diagnose.run_rules import live_findings

        findings = live_findings(self.records, config=trainer.config, device=str(trainer.device),
                                 precision=trainer.precision,
                                 task=trainer.profile.to_dict() if trainer.profile is not None else None)
        for finding in findings:
            if finding.severity == "info" or finding.code in self.reported:
                continue
            self.reported.add(finding.code)
            trainer.run_dir.log_event("diagnosis", finding.title, severity=_EVENT_SEVERITY[finding.severity],
                                      step=finding.step or trainer.step, evidence=finding.to_dict())
            self.console.print(f"[yellow]diagnosis[/] step {finding.step or trainer.step}: {finding.title} "
                               f"(trainwise diagnose {trainer.run_dir.path})", highlight=False, soft_wrap=True)


class SanityFindings(Callback):
    """Writes the warnings of the pre-training sanity checks (errors already stopped the run) as events."""

    def __init__(self, findings, console: Console | None = None):
        self.findings = [f for f in findings if f.severity != "info"]
        self.console = console or TrainingConsole()

    def on_fit_start(self, trainer) -> None:
        if trainer.step:  # a resumed run logged them when it started
            return
        for finding in self.findings:
            trainer.run_dir.log_event("sanity", finding.title, severity=_EVENT_SEVERITY[finding.severity],
                                      step=0, evidence=finding.to_dict())
            if trainer.ranks.is_main:  # said at the terminal too, in one line, before the first step
                self.console.print(f"[yellow]warning[/]: {finding.title}", highlight=False, soft_wrap=True)


_EVENT_SEVERITY = {"info": "info", "warn": "warning", "error": "error"}
