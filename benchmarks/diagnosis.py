"""Fault injection: does trainwise name each fault, with evidence, and stay silent on healthy runs?

Each fault is injected into a small real run through the product's own path (`build_trainer` + `fit`, or
`trainwise check`'s sanity checks for data faults, or a run directory whose telemetry is replayed from a
recorded hot GPU), then the findings are read the way a user reads them: `diagnose_run(RUN)` plus the
events the engine wrote (out-of-memory recoveries, non-finite stops) and the error it raised. A fault is
*named* when one of the findings it should produce is there with evidence. Then 5 healthy runs of the
built-in recipes (several seeds) must give no finding of warn or worse.

    .venv/bin/python benchmarks/diagnosis.py      -> benchmarks/results/diagnosis.json
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise import ArrayDataset, DataSpec, RunDir, Trainer, TrainwiseError  # noqa: E402
from trainwise.diagnose.run_rules import diagnose_run  # noqa: E402
from trainwise.check.sanity import sanity_check  # noqa: E402
from trainwise.recipes import load_recipe  # noqa: E402
from trainwise.recipes.factories import build_data  # noqa: E402
from trainwise.launch.runs import build_trainer  # noqa: E402

QUIET = ["telemetry.enabled=false", "train.device=cpu", "eval.early_stopping.enabled=false"]


def recipe_run(tmp: Path, name: str, recipe: str, overrides: list[str], callbacks=()) -> tuple[RunDir, str | None]:
    """Train a built-in recipe with overrides; the run directory and the error text, if it failed."""
    run = RunDir(tmp / name)
    error = None
    try:
        trainer = build_trainer(load_recipe(recipe, [*QUIET, *overrides]), run, callbacks)
        run.initialise()
        trainer.fit()
    except (TrainwiseError, RuntimeError) as failure:
        error = f"{type(failure).__name__}: {failure}"
    return run, error


def codes_of(run: RunDir) -> dict[str, dict]:
    """Finding code -> evidence, from `trainwise diagnose` and from what the engine logged as it ran."""
    found = {f.code: f.evidence for f in diagnose_run(run)} if run.metrics_path.exists() else {}
    for event in run.read_events() if run.events_path.exists() else []:
        if event.get("severity") in ("warning", "error") and event.get("kind") not in ("signal", "stopped"):
            found.setdefault(event["kind"], event.get("evidence") or {"message": event.get("message")})
    return found


class OutOfMemoryAbove(nn.Module):
    """The breast-cancer MLP on a 'card' that holds `limit` samples: larger batches raise the allocator's error."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.net = limit, nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x):
        if self.training and len(x) > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for {len(x)} samples")
        return self.net(x)


class Leaky(nn.Module):
    """Keeps every output, as a loop that appends loss tensors to a list does: 4 MiB more each step."""

    def __init__(self):
        super().__init__()
        self.net, self.kept = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2)), []

    def forward(self, x):
        self.kept.append(torch.ones(2**20))
        return self.net(x)


class SlowDataset(Dataset):
    """Decodes slowly: 4 ms a sample, where the model needs microseconds."""

    def __init__(self, inputs, targets):
        self.inputs, self.targets = inputs, targets

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, index):
        time.sleep(0.004)
        return self.inputs[index], self.targets[index]


def python_run(tmp: Path, name: str, model: nn.Module, dataset: Dataset, overrides: list[str]) -> RunDir:
    config = load_recipe("breast-cancer", [*QUIET, "train.sanity=false", *overrides])
    bundle = build_data(config)
    run = RunDir.create(tmp / name)
    Trainer(model, dataset if dataset is not None else bundle.train, bundle.val, config=config, run_dir=run,
            data_spec=bundle.spec).fit()
    return run


def sanity_codes(overrides: list[str], mutate) -> dict[str, dict]:
    config = load_recipe("breast-cancer", [*QUIET, *overrides])
    bundle = build_data(config)
    mutate(bundle)
    return {f.code: f.evidence for f in sanity_check(config, bundle) if f.severity in ("warn", "error")}


def replayed_hot_gpu(tmp: Path) -> RunDir:
    """A finished run whose system.jsonl is an H100's recorded samples: heating past 90 °C, throttling."""
    run, _ = recipe_run(tmp, "thermal", "breast-cancer", ["train.max_steps=60", "train.log_every=5"])
    start = time.time()
    for i in range(40):
        temperature = 70 + i * 0.6
        run.log_system({"time": start + i, "step": 1 + i, "gpus": [{
            "index": 0, "name": "NVIDIA H100 80GB HBM3", "temperature_c": temperature, "utilization_pct": 97,
            "memory_used_bytes": 60 * 2**30, "memory_total_bytes": 80 * 2**30, "power_w": 690, "fan_pct": 100,
            "sm_clock_mhz": 1980 - (300 if temperature > 88 else 0),
            "throttle_reasons": ["hw_thermal_slowdown"] if temperature > 88 else []}]})
    return run


def faults(tmp: Path) -> list[dict]:
    results = []

    def record(fault: str, expected: tuple[str, ...], found: dict[str, dict], error: str | None = None):
        hit = next((code for code in expected if code in found), None)
        evidence = found.get(hit) if hit else None
        results.append({"fault": fault, "named": bool(hit and evidence), "finding": hit, "expected": list(expected),
                        "evidence": evidence, "other_findings": sorted(set(found) - {hit}), "error": error})
        print(f"{fault:28s} {'named' if hit else 'MISSED':6s} {hit or ''}  ({', '.join(sorted(found))})", flush=True)

    small = ["train.max_steps=120", "train.log_every=5", "eval.every_steps=20"]
    run = python_run(tmp, "oom", OutOfMemoryAbove(limit=16), None, [*small, "train.batch_size=64"])
    record("out of memory", ("oom_recovered",), codes_of(run))
    run, error = recipe_run(tmp, "nan", "breast-cancer", [*small, "optim.lr=1e6", "train.grad_clip_norm=null"])
    record("non-finite loss", ("nonfinite", "loss_nonfinite", "loss_diverging"), codes_of(run), error)
    run, error = recipe_run(tmp, "lr-x100", "digits", [*small, "optim.lr=0.3", "schedule.warmup_steps=0",
                                                         "train.grad_clip_norm=null"])
    record("learning rate x100", ("loss_diverging", "loss_at_chance", "loss_oscillating", "gradient_spikes",
                                  "nonfinite", "loss_nonfinite"), codes_of(run), error)
    run, error = recipe_run(tmp, "lr-zero", "digits", [*small, "optim.lr=1e-9"])
    record("learning rate ~0", ("loss_flat", "underfitting"), codes_of(run), error)
    bundle = build_data(load_recipe("breast-cancer", QUIET))
    slow = SlowDataset(bundle.train.inputs, bundle.train.targets)
    run = python_run(tmp, "starved", nn.Sequential(nn.Linear(30, 2)), slow,
                     ["train.max_steps=40", "train.log_every=5", "data.num_workers=0"])
    record("data-starved loader", ("data_starved",), codes_of(run))
    run, error = recipe_run(tmp, "overfit", "breast-cancer", [
        "train.max_steps=600", "train.log_every=10", "eval.every_steps=20", "model.args.hidden=[512,512]",
        "model.args.dropout=0", "optim.lr=0.003", "optim.weight_decay=0", "data.augment=false",
        "data.val_fraction=0.5", "data.test_fraction=0.3"])
    record("tiny data, big model", ("overfitting",), codes_of(run), error)
    found = {}
    try:  # train refuses labels its model cannot output before any step (check_labels, then the sanity checks)
        from trainwise.data.bundle import check_labels

        broken = build_data(load_recipe("breast-cancer", QUIET))
        broken.train.targets[:5] = 7
        check_labels(broken)
    except TrainwiseError as refused:
        found["label_out_of_range"] = {"message": str(refused)}
    record("label out of range", ("label_out_of_range",), found)
    record("unnormalised inputs", ("unnormalised_inputs",),
           sanity_codes(["data.augment=false"], lambda b: b.train.inputs.mul_(1000)))

    def leak(b):
        b.test.inputs[:40] = b.train.inputs[:40]
        b.test.targets[:40] = b.train.targets[:40]

    record("train/test leakage", ("train_test_leakage",), sanity_codes([], leak))
    run = python_run(tmp, "leak", Leaky(), None, ["train.max_steps=150", "train.log_every=5",
                                                  "telemetry.enabled=true", "telemetry.interval_s=0.05"])
    record("memory leak", ("memory_leak",), codes_of(run))
    record("thermal throttling (replayed)", ("gpu_temperature", "gpu_throttle"), codes_of(replayed_hot_gpu(tmp)))
    return results


def healthy(tmp: Path) -> list[dict]:
    runs = []
    for recipe, seed in (("digits", 0), ("digits", 1), ("breast-cancer", 0), ("breast-cancer", 1),
                         ("breast-cancer", 2)):
        # the recipe as a user runs it (early stopping included): only the seed changes
        run, error = recipe_run(tmp, f"healthy-{recipe}-{seed}", recipe, [f"seed={seed}",
                                                                           "eval.early_stopping.enabled=true"])
        found = [f for f in diagnose_run(run) if f.severity in ("warn", "error")]
        sanity = [f for f in sanity_check(load_recipe(recipe, [*QUIET, f"seed={seed}"]))
                  if f.severity in ("warn", "error")]
        runs.append({"recipe": recipe, "seed": seed, "error": error,
                     "false_alarms": [f.code for f in found + sanity]})
        print(f"healthy {recipe} seed {seed}: {[f.code for f in found + sanity] or 'silent'}", flush=True)
    return runs


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        injected = faults(tmp)
        clean = healthy(tmp)
    false_alarms = sum(len(r["false_alarms"]) for r in clean)
    named = sum(r["named"] for r in injected)
    print(f"named {named} of {len(injected)} faults; {false_alarms} warn-or-worse findings on {len(clean)} "
          f"healthy runs")
    write_result("diagnosis", {
        "description": __doc__.strip().splitlines()[0],
        "faults": injected, "healthy_runs": clean, "false_alarms": false_alarms,
        "targets": {"faults_named": len(injected), "false_alarms": 0},
        "meets_targets": named == len(injected) and false_alarms == 0,
        "wall_s": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
