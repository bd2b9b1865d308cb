"""Diagnose a run: every rule over what its directory records, worst first.

    from trainwise.diagnose.run_rules import diagnose_run
    for finding in diagnose_run("runs/bc"):
        print(finding.severity, finding.code, finding.step, finding.title)

`diagnose(facts)` is pure (RunFacts in, findings out); `read_facts` is the only part that reads files, and it
reads them through RunDir. `live_findings` is the same rules on the rolling window the engine holds while
training, so the live checks and `trainwise diagnose` never disagree.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from trainwise.config import RunConfig, TelemetryConfig, warmup_steps
from trainwise.diagnose.curve_analysis import analyse_curves
from trainwise.diagnose.task_profile import TaskProfile
from trainwise.findings import Finding, worst_first
from trainwise.diagnose.hardware import hardware_findings
from trainwise.diagnose.memory import memory_findings
from trainwise.diagnose.throughput import throughput_findings
from trainwise.errors import RunDirError
from trainwise.rundir.layout import RunDir


@dataclass(frozen=True)
class RunFacts:
    """What a run directory records, as the rules read it."""
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    system: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config: RunConfig | None = None  # None: an older or hand-edited config; the rules use defaults


def read_facts(run: RunDir | str | os.PathLike) -> RunFacts:
    """The records of `run` (RunDirError when it is not a run directory). An unreadable config leaves
    `config` None rather than failing: the curves can still be read."""
    from trainwise.errors import TrainwiseError

    run = run if isinstance(run, RunDir) else RunDir.open(run)
    try:
        config = run.read_config()
    except TrainwiseError:
        config = None
    return RunFacts(metrics=run.read_metrics(), events=run.read_events(), system=run.read_system(),
                    summary=run.read_summary(), config=config)


def diagnose_run(run: RunDir | str | os.PathLike) -> list[Finding]:
    """All findings of a run, worst first. RunDirError (exit 2) for a path that is not a run directory or a
    run that has logged no metrics yet: there is nothing to judge."""
    run = run if isinstance(run, RunDir) else RunDir.open(run)
    facts = read_facts(run)
    if not facts.metrics:
        raise RunDirError(f"{run.path} has no metrics yet: nothing to diagnose until the first log line "
                          "(train.log_every steps in).")
    return diagnose(facts)


def diagnose(facts: RunFacts) -> list[Finding]:
    """Every rule over the facts, worst first."""
    # A hand-edited record can hold absurd magnitudes (1e308): sums overflow to inf, which then fails every
    # rule's comparison. That is the right outcome, and not worth a RuntimeWarning per rule.
    with np.errstate(over="ignore", invalid="ignore"):
        return _diagnose(facts)


def _diagnose(facts: RunFacts) -> list[Finding]:
    config = facts.config
    eval_config = config.eval if config else None
    curves = analyse_curves(
        facts.metrics, monitor=eval_config.monitor if eval_config else "val/loss",
        mode=eval_config.monitor_mode if eval_config else "auto",
        patience=eval_config.early_stopping.patience if eval_config else 3,
        early_stopping=bool(eval_config and eval_config.early_stopping.enabled),
        warmup_steps=_warmup_steps(config, facts.summary), task=TaskProfile.from_dict(facts.summary.get("task")))
    settings = config.telemetry if config else TelemetryConfig()
    return worst_first([
        *curves.findings,
        *throughput_findings(facts.metrics, facts.system, config=config, summary=facts.summary),
        *memory_findings(facts.metrics, facts.system, max_steps=_max_steps(config, facts.summary)),
        *hardware_findings(facts.system, facts.events, settings=settings),
    ])


def live_findings(records: Sequence[dict[str, Any]], system: Sequence[dict[str, Any]] = (), *,
                  config: RunConfig | None = None, device: str | None = None,
                  precision: str | None = None, task: dict[str, Any] | None = None) -> list[Finding]:
    """The run rules on what the engine holds while training, worst first: for the live checks.

    `records`: the metrics records logged so far (train and val, as written to metrics.jsonl). Keep at least
    the first records of the run in the window: a flat or diverging loss is measured against where it
    started. `system`: recent telemetry samples. `device`, `precision`: the trainer's resolved ones (as
    summary.json records them), for the slow-training rules. `task`: the run's TaskProfile as a dict (what
    chance is), for the rules that compare to chance; without it they stay silent. Rules that only make sense
    at the end (a run "still improving") are left out. Pure and cheap (a few hundred records take milliseconds): call it from
    `on_log` or `on_eval`, and act on the codes that are new since the last call.
    """
    found = diagnose(RunFacts(metrics=list(records), system=list(system), config=config,
                              summary={"device": device, "precision": precision, "task": task}))
    return [f for f in found if f.code != "still_improving"]


def _warmup_steps(config: RunConfig | None, summary: dict[str, Any]) -> int:
    if config is None:
        return 0
    return warmup_steps(config.schedule, _max_steps(config, summary) or 0)


def _max_steps(config: RunConfig | None, summary: dict[str, Any]) -> int | None:
    steps = summary.get("max_steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
        return steps
    return config.train.max_steps if config else None
