"""`trainwise recommend`; cli/app.py calls register(app)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from trainwise.errors import ConfigError

console = Console()


def register(app: typer.Typer) -> None:
    app.command("recommend")(recommend_command)


def recommend_command(
    run_dir: Path = typer.Argument(..., help="A recommender run directory (shop-sasrec, shop-din, ...)."),
    user: Optional[str] = typer.Option(None, "--user", help="The user's id, as in the shop's log."),
    users: Optional[Path] = typer.Option(None, "--users", help="A file of user ids, one a line: recommend for "
                                         "each (JSON lines with --json, else a table)."),
    k: int = typer.Option(10, "--k", help="How many items to recommend."),
    include_seen: bool = typer.Option(False, "--include-seen", help="Also recommend items the user already had."),
    checkpoint: str = typer.Option("best", help="Weights: best or last checkpoint, or final (model.safetensors)."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON (one line per user with --users)."),
) -> None:
    """The top-K items for a user (or a file of users), with the history used and, for DIN, the behaviours
    that weighed most."""
    from trainwise.evaluate.recommend import Recommender, read_user_file

    if (user is None) == (users is None):
        raise ConfigError("recommend: give one user with --user ID, or a file of user ids with --users FILE.")
    if k < 1:
        raise ConfigError(f"--k {k}: ask for at least one item.")
    ids = [user] if user is not None else read_user_file(users)
    recommender = Recommender(run_dir, checkpoint)
    answers = recommender.recommend_many(ids, k=k, include_seen=include_seen)
    if users is not None:
        _print_batch(answers, as_json)
        return
    answer = next(answers)
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    console.print(f"user {answer['user']}: {answer['note']}")
    if answer["history"]:
        console.print(f"history used (newest last): {' '.join(map(str, answer['history'][-20:]))}")
    for rank, entry in enumerate(answer["recommendations"], start=1):
        console.print(f"{rank:>3}. item {entry['item']}  score {entry['score']:.4g}")
    weighed = answer.get("weighed_most")
    if weighed:
        console.print(f"for item {weighed['for_item']}, the behaviours that weighed most:")
        for entry in weighed["behaviours"]:
            console.print(f"     item {entry['item']} ({entry['position_from_newest']} events ago), "
                          f"weight {entry['weight']:.3g}")


def _print_batch(answers, as_json: bool) -> None:
    if as_json:  # JSON lines: one answer per user, printed as it is ready
        for answer in answers:
            print(json.dumps(answer), flush=True)
        return
    table = Table("user", "known", "history", "recommended items (best first)")
    for answer in answers:
        table.add_row(str(answer["user"]), "yes" if answer["known"] else "no: popular items",
                      str(len(answer["history"])), " ".join(str(r["item"]) for r in answer["recommendations"]))
    console.print(table)
