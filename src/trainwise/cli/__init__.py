"""The face: the `trainwise` command. One Typer app (cli/app.py) and one module per command group; each
command parses its arguments, calls one function of the room that owns the work, and prints. The only
package that imports Typer."""
from trainwise.cli.app import app, main

__all__ = ["app", "main"]
