"""lr-find's promise: on digits and breast-cancer, a short run at the suggested learning rate ends with a
validation loss within 10% of the best of a 7-point learning-rate grid of the same short runs.

For each recipe and seed: `trainwise lr-find` with its defaults, then short full runs (the recipe's
optimizer, warm-up and cosine decay, no early stopping, one evaluation at the end) at the suggestion and at
each grid point, 1e-4 to 1e-1 in half-decade steps, all from that seed (same weights, split and data order).
The figure is mean final val/loss at the suggestion / the lowest mean final val/loss of a grid point.

breast-cancer's validation split has 85 samples: one confidently wrong prediction moves its loss by 10%, so
it is averaged over 3 seeds (its runs take seconds); digits' 270-sample split is steadier, and one seed
keeps the benchmark to minutes.

    python benchmarks/lr_find.py            # 150-step runs
    python benchmarks/lr_find.py --quick    # 60-step runs, one seed: checks the script, not the figure
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise.check.lr_find import lr_find_config  # noqa: E402
from trainwise.recipes import load_recipe  # noqa: E402
from trainwise.rundir.layout import RunDir  # noqa: E402
from trainwise.launch.runs import build_trainer  # noqa: E402

SEEDS = {"digits": (0,), "breast-cancer": (0, 1, 2)}
GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
TOLERANCE = 0.10
QUIET = ["telemetry.enabled=false", "eval.every_epoch=false", "eval.early_stopping.enabled=false"]


def final_val_loss(recipe: str, seed: int, lr: float, steps: int, workdir: Path) -> float:
    """A short full run at `lr`; its validation loss at the last step."""
    config = load_recipe(recipe, [*QUIET, f"seed={seed}", f"optim.lr={lr!r}", f"train.max_steps={steps}",
                                  f"eval.every_steps={steps}", f"checkpoint.every_steps={steps}",
                                  f"train.log_every={steps}"])
    run = RunDir(workdir / f"{recipe}-{seed}-lr{lr:.3g}")
    run.initialise(overwrite=True)
    trainer = build_trainer(config, run)
    trainer.fit()
    return trainer.evaluate()["loss"]


def one_seed(recipe: str, seed: int, steps: int, workdir: Path) -> dict:
    started = time.perf_counter()
    found = lr_find_config(load_recipe(recipe, [f"seed={seed}", "telemetry.enabled=false"]))
    sweep_s = time.perf_counter() - started
    suggested = final_val_loss(recipe, seed, found.suggestion, steps, workdir)
    grid = [final_val_loss(recipe, seed, lr, steps, workdir) for lr in GRID]
    print(f"{recipe} seed {seed}: suggestion {found.suggestion:.3g} -> val/loss {suggested:.4f}; grid "
          + " ".join(f"{lr:g}:{loss:.4f}" for lr, loss in zip(GRID, grid)) + f" (sweep {sweep_s:.1f} s)",
          flush=True)
    return {"seed": seed, "suggestion": found.suggestion, "sweep_steps": len(found.lrs),
            "sweep_diverged": found.diverged, "sweep_s": round(sweep_s, 2), "note": found.note,
            "suggested_final_val_loss": suggested, "grid_final_val_loss": grid}


def one_recipe(recipe: str, seeds: tuple[int, ...], steps: int, workdir: Path) -> dict:
    started = time.perf_counter()
    per_seed = [one_seed(recipe, seed, steps, workdir) for seed in seeds]
    suggested = sum(r["suggested_final_val_loss"] for r in per_seed) / len(per_seed)
    grid = {f"{lr:g}": sum(r["grid_final_val_loss"][i] for r in per_seed) / len(per_seed)
            for i, lr in enumerate(GRID)}
    best_lr, best = min(grid.items(), key=lambda item: item[1])
    ratio = suggested / best
    print(f"{recipe}: mean val/loss at the suggestion {suggested:.4f}; grid best {best:.4f} at lr {best_lr}; "
          f"ratio {ratio:.3f}")
    return {"seeds": list(seeds), "per_seed": per_seed, "suggested_final_val_loss": suggested,
            "grid_final_val_loss": grid, "grid_best_lr": float(best_lr), "grid_best_final_val_loss": best,
            "ratio_to_grid_best": ratio, "within_tolerance": ratio <= 1 + TOLERANCE,
            "wall_s": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60-step runs: a check that the script works")
    parser.add_argument("--steps", type=int, default=None, help="steps of each short run (default 150)")
    parser.add_argument("--recipes", nargs="+", choices=sorted(SEEDS), default=sorted(SEEDS))
    args = parser.parse_args()
    steps = args.steps or (60 if args.quick else 150)
    with tempfile.TemporaryDirectory() as tmp:
        results = {recipe: one_recipe(recipe, SEEDS[recipe][:1] if args.quick else SEEDS[recipe], steps,
                                      Path(tmp)) for recipe in args.recipes}
    write_result("lr_find", {
        "description": __doc__.strip().splitlines()[0], "quick": args.quick, "run_steps": steps,
        "grid": list(GRID), "targets": {"ratio_to_grid_best_at_most": 1 + TOLERANCE},
        "recipes": results, "meets_targets": all(r["within_tolerance"] for r in results.values())
        and sorted(results) == sorted(SEEDS),
    })


if __name__ == "__main__":
    main()
