"""CLI commands of this room; cli.py calls register(app)."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
