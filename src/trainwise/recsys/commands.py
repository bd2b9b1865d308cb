"""CLI commands of this room (recommend); cli.py calls register(app)."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

console = Console()


def register(app: typer.Typer) -> None:
    app.command("recommend")(recommend_command)


def recommend_command(
    run_dir: Path = typer.Argument(..., help="A recommender run directory (shop-sasrec, shop-din, ...)."),
    user: str = typer.Option(..., "--user", help="The user's id, as in the shop's log."),
    k: int = typer.Option(10, "--k", help="How many items to recommend."),
    include_seen: bool = typer.Option(False, "--include-seen", help="Also recommend items the user already had."),
    checkpoint: str = typer.Option("best", help="Weights: best or last checkpoint, or final (model.safetensors)."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
) -> None:
    """The top-K items for a user, with the history used and, for DIN, the behaviours that weighed most."""
    from trainwise.recsys.recommend import recommend

    answer = recommend(run_dir, user, k=k, include_seen=include_seen, checkpoint=checkpoint)
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
