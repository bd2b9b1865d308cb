"""Finding: what one doctor check concluded, in the user's words, with the evidence and the fix."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]
STATUS_ORDER: dict[str, int] = {"ok": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class Finding:
    status: Status
    """ok: nothing to do; warn: works but costs speed or will bite later; fail: training will not work."""
    title: str
    """What was checked, e.g. "Data disk"."""
    finding: str
    """One line: what we found."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """The facts the conclusion rests on (versions, paths, numbers)."""
    fix: str | None = None
    """What to do, with the exact command where there is one; None when nothing needs doing."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Finding":
        return cls(status=raw["status"], title=raw["title"], finding=raw["finding"],
                   evidence=dict(raw.get("evidence") or {}), fix=raw.get("fix"))


def worst(findings: list[Finding]) -> Status:
    """The most serious status among `findings` ("ok" when there are none)."""
    return max((f.status for f in findings), key=STATUS_ORDER.__getitem__, default="ok")
