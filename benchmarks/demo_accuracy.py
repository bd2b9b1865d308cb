"""The demo's promise: `digits` reaches ≥97% test accuracy on 2 CPU cores in under 60 s of training.

Trains the built-in recipe exactly as `trainwise demo` does, evaluates the held-out test split with the
best checkpoint, and records accuracy and training wall time.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise.evaluate.run_eval import evaluate_run  # noqa: E402
from trainwise.recipes import load_recipe  # noqa: E402
from trainwise.launch.runs import train_run  # noqa: E402


def main() -> None:
    config = load_recipe("digits")
    with tempfile.TemporaryDirectory() as tmp:
        run = train_run(config, Path(tmp) / "demo")
        summary = run.read_summary()
        metrics = evaluate_run(run, split="test", checkpoint="best")
    accuracy, seconds = metrics["accuracy"], summary["timings"]["wall_s"]
    print(f"digits: test accuracy {accuracy:.4f} after {summary['steps']} steps, {seconds:.1f} s of training")
    write_result("demo_accuracy", {
        "description": __doc__.strip().splitlines()[0],
        "recipe": "digits", "steps": summary["steps"], "train_wall_s": seconds,
        "test_accuracy": accuracy, "test_balanced_accuracy": metrics["balanced_accuracy"],
        "targets": {"test_accuracy_at_least": 0.97, "train_wall_s_under": 60},
        "meets_targets": accuracy >= 0.97 and seconds < 60,
    })


if __name__ == "__main__":
    main()
