"""Ablation demo: `breast-cancer`, 3 switches x 3 seeds (12 runs), on this machine's cores.

    .venv/bin/python benchmarks/ablation_demo.py            # parallel (one run per core) vs one at a time
    .venv/bin/python benchmarks/ablation_demo.py --parallel-only

Records the wall time of the whole ablation with parallel runs against the same ablation run one at a time
(ratio, same machine, same moment), and the resulting table: mean ± std of test balanced accuracy per
variant, delta vs baseline, Welch's t-test p-value. Writes benchmarks/results/ablation_demo.json.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise.evaluate.ablate import ablate  # noqa: E402

SWITCHES = ["augmentation", "weight_decay", "dropout"]
SEEDS = 3
METRIC = "test/balanced_accuracy"


def run(out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    result = ablate("breast-cancer", SWITCHES, out=out, seeds=SEEDS, metric=METRIC, workers=workers,
                    on_progress=lambda message: print(f"[{workers} at a time] {message}", flush=True))
    wall = time.perf_counter() - started
    return {"workers": workers, "wall_s": round(wall, 1), "load_avg_before": load_before,
            "load_avg_after": os.getloadavg()[0], "result": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel-only", action="store_true", help="skip the one-at-a-time baseline")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ablation_demo_"))
    cores = os.cpu_count() or 1
    parallel = run(root / "parallel", workers=cores)
    sequential = None if args.parallel_only else run(root / "sequential", workers=1)
    table = [{k: row[k] for k in ("name", "n", "mean", "std", "delta", "p_value", "verdict")}
             for row in parallel["result"]["variants"]]
    for row in table:
        print(f"{row['name']:28s} {row['mean']:.4f} ± {row['std']:.4f}  "
              f"delta {row['delta'] if row['delta'] is None else round(row['delta'], 4)}  "
              f"p {row['p_value'] if row['p_value'] is None else round(row['p_value'], 3)}  {row['verdict']}")
    payload = {
        "recipe": "breast-cancer", "switches": SWITCHES, "seeds": SEEDS, "metric": METRIC,
        "runs": len(parallel["result"]["runs"]), "noise_test": parallel["result"]["test"],
        "parallel": {k: v for k, v in parallel.items() if k != "result"},
        "table": table,
        "note": "load_avg_*: 1-minute load average of the machine (other work shares it); the ratio is "
                "measured on the same jobs at nearly the same moment",
    }
    if sequential:
        payload["one_at_a_time"] = {k: v for k, v in sequential.items() if k != "result"}
        payload["speedup_parallel_vs_one_at_a_time"] = round(sequential["wall_s"] / parallel["wall_s"], 2)
        payload["same_table_both_ways"] = table == [
            {k: row[k] for k in ("name", "n", "mean", "std", "delta", "p_value", "verdict")}
            for row in sequential["result"]["variants"]]
    write_result("ablation_demo", payload)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
