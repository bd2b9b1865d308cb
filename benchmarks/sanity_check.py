"""The pre-training sanity checks are cheap: on each built-in recipe they finish in under 5 s once the
imports are paid (the first call pays sklearn's and torch's optimizers', as `trainwise train` does).
The median of 3 timed calls per recipe, after one untimed call.

    python benchmarks/sanity_check.py      -> benchmarks/results/sanity_check.json
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise.check.sanity import sanity_check  # noqa: E402
from trainwise.recipes import load_recipe  # noqa: E402

TARGET_S = 5.0
RECIPES = ("breast-cancer", "digits")


def seconds(recipe: str, repeats: int = 3) -> float:
    config = load_recipe(recipe)
    sanity_check(config)  # imports and the data's first build, as a run pays them once
    timed = []
    for _ in range(repeats):
        started = time.perf_counter()
        sanity_check(config)
        timed.append(time.perf_counter() - started)
    return statistics.median(timed)


def main() -> None:
    per_recipe = {recipe: round(seconds(recipe), 3) for recipe in RECIPES}
    for recipe, value in per_recipe.items():
        print(f"{recipe}: {value:.2f} s")
    write_result("sanity_check", {
        "description": "seconds of `sanity_check` on each built-in tabular/image recipe, after one untimed call",
        "target": f"each under {TARGET_S:g} s",
        "seconds": per_recipe,
        "meets_targets": all(value < TARGET_S for value in per_recipe.values()),
        "note": "measured on a 2-core machine shared with other jobs (load average above 10): "
                "the figures are upper bounds of a quiet machine's",
    })


if __name__ == "__main__":
    main()
