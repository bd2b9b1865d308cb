"""A training run that failed: keep the whole traceback, and say what it means.

The Trainer calls `record_failure` on any exception: the traceback goes to RUN/error.log, the diagnosis of
`trainwise explain` (the same rules, over the same text) to events.jsonl, and a one-line cause with the
first fixes to summary.json."""
from __future__ import annotations

import traceback

from trainwise.diagnose.explain import explain
from trainwise.rundir.layout import RunDir


def record_failure(run_dir: RunDir, error: BaseException, step: int) -> str:
    """Write the traceback and the finding; return the cause for the summary."""
    text = "".join(traceback.format_exception(error))
    run_dir.write_error_log(text)
    finding = explain(text)
    cause = f"{type(error).__name__}: {error}"
    if finding.code != "unknown":
        run_dir.log_event("failed", f"{finding.title}: {finding.detail}", severity="error", step=step,
                          evidence=finding.to_dict())
        cause += f" [{finding.code}: {finding.title}; fixes: {'; '.join(finding.fixes[:2])}]"
    return cause
