"""Whose code a run directory asks to run.

A run's config.yaml may name factories (`model.factory: package.module:function`); `eval` and `resume`
rebuild the model by calling them. A run directory made by someone else (copied, downloaded, shared) could
name anything, so, like the well-known `trust_remote_code`, it runs no factory until the user says
`--trust-code`. A run is this user's own when its config.yaml belongs to this user and its last writer (the
host recorded in RUN/.lock) is this machine. Factories from the standard library are refused anyway
(recipes/factories.py); built-in models run no code from the run directory at all.
"""
from __future__ import annotations

import json
import os
import socket
from typing import TYPE_CHECKING

from trainwise.errors import RunDirError

if TYPE_CHECKING:
    from trainwise.config import RunConfig
    from trainwise.rundir.layout import RunDir


def require_trust(run: "RunDir", config: "RunConfig", *, trust_code: bool, command: str) -> None:
    """Raise RunDirError when `run` names factories and is not this user's own, unless `trust_code`."""
    factories = [f"{field}: {reference}" for field, reference in (("model.factory", config.model.factory),
                                                                   ("data.factory", config.data.factory)) if reference]
    if not factories or trust_code:
        return
    foreign = foreign_because(run)
    if foreign:
        raise RunDirError(f"{run.path} was {foreign}, and its config names code to run ({'; '.join(factories)}). "
                          f"Read {run.config_path.name} first; if you trust that code, run `trainwise {command} "
                          f"{run.path} --trust-code`.")


def foreign_because(run: "RunDir") -> str | None:
    """Why the run is not this user's own on this machine, or None when it is."""
    owner = run.config_path.stat().st_uid if hasattr(os, "getuid") else None
    if owner is not None and owner != os.getuid():
        return f"created by another user (uid {owner}; you are uid {os.getuid()})"
    host = _recorded_host(run)
    if host and host != socket.gethostname():
        return f"written on another machine ({host}; this is {socket.gethostname()})"
    return None


def _recorded_host(run: "RunDir") -> str | None:
    try:
        recorded = json.loads(run.lock_path.read_text() or "null")
    except (OSError, ValueError):
        return None
    host = recorded.get("host") if isinstance(recorded, dict) else None
    return host if isinstance(host, str) and host else None
