"""`trainwise check RECIPE`: the sanity checks before training, each result a finding.

    from trainwise.check.sanity import sanity_check
    findings = sanity_check(load_recipe("digits"))      # worst first; any "error" means: do not train yet

Builds the recipe's data and a fresh model the way `train` does, then checks the labels and inputs of each
split (diagnose/sanity_data.py) and runs the overfit-one-batch probe (check/overfit_one_batch.py). Fast by
design: at most MAX_ROWS rows of each split are read, and the probe is a few dozen steps on one batch.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from trainwise.config import RunConfig
from trainwise.findings import Finding, worst_first
from trainwise.diagnose.sanity_data import SplitData, data_findings
from trainwise.check.overfit_one_batch import probe_step, trainable_snapshot

# Rows read per split: enough to see the label distribution, a NaN or a duplicate of any built-in data set
# whole, and a large prepared one in well under a second.
MAX_ROWS = 50_000
PROBE_ROWS = 64  # one batch: the run's micro-batch, capped so the probe stays fast on the CPU
TOKENS_READ = 1 << 20  # text: the first sequences of each split up to about this many tokens


def sanity_check(config: RunConfig, bundle: Any = None, model: Any = None) -> list[Finding]:
    """Every sanity finding for `config`, worst first. `bundle`, `model`: the DataBundle and the model when the
    caller has built them already (`train` has: the probe then trains that model and gives its weights back as
    they were, rather than loading a second copy); built from the config otherwise. Bad labels raise DataError
    (exit 2).

    Leaves the random state as it found it, so a run trained after its check starts from the same weights
    as one trained without it."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        return _sanity_check(config, bundle, model)


def raise_for_errors(findings: list[Finding]) -> None:
    """For `train`: a DataError (exit 2) naming each error-severity finding, so a run that cannot learn is not
    started; warnings pass (the caller logs them). `train.sanity=false` skips the checks altogether."""
    from trainwise.errors import DataError

    errors = [f for f in findings if f.severity == "error"]
    if errors:
        lines = [f"{f.code}: {f.title}" + (f" ({f.fixes[0]})" if f.fixes else "") for f in errors]
        raise DataError("the sanity checks found what would make this run fail:\n  " + "\n  ".join(lines) +
                        "\nSee every finding with `trainwise check RECIPE [overrides]`; to train anyway, set "
                        "train.sanity=false.")


def _sanity_check(config: RunConfig, bundle: Any, built: Any = None) -> list[Finding]:
    from trainwise.data.bundle import check_labels
    from trainwise.diagnose.task_profile import check_monitor, task_profile, validation_kind
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.runtime.device import resolve_device
    from trainwise.runtime.precision import resolve_precision
    from trainwise.train.step.train_step import TrainStep

    started = time.perf_counter()
    torch.manual_seed(config.seed)
    bundle = bundle if bundle is not None else build_data(config)
    check_labels(bundle)
    spec = bundle.spec
    if bundle.val is not None:  # a typo in eval.monitor: said here (check, train), not at the first evaluation
        check_monitor(config.eval.monitor, validation_kind(spec, task_profile(spec)))
    splits = [split_data(name, dataset) for name, dataset in
              (("train", bundle.train), ("val", bundle.val), ("test", bundle.test)) if dataset is not None]
    findings = data_findings(splits, task=spec.task, num_classes=spec.num_classes, class_names=spec.class_names)
    train = splits[0]
    # one micro-batch of the run's own size: the probe must fit wherever a training step fits
    rows = min(config.train.micro_batch, PROBE_ROWS, len(train.inputs))
    inputs, targets = train.inputs[:rows], train.targets[:rows]
    if spec.task == "causal_lm":  # a token batch, with its position ids
        samples = [bundle.train[i] for i in range(rows)]
        inputs, targets = {key: torch.stack([s[key] for s in samples]) for key in samples[0]}, None
    torch.manual_seed(config.seed)
    model = built if built is not None else build_model(config, spec)
    if getattr(model, "counted", False):  # fitted by counting (the popularity baseline): nothing to memorise
        return worst_first(findings)
    device = resolve_device(config.train.device)
    with weights_kept(model, restore=built is not None) as before:
        # the run's own step (TrainStep.from_config), so what the probe finds is what training would meet
        step = TrainStep.from_config(model.to(device), config, task=spec.task, device=device,
                                     precision=resolve_precision(config.train.precision, device))
        try:
            findings.append(probe_step(step, inputs, targets, before=before, planned_steps=config.train.total_steps(
                len(bundle.train)) * max(1, config.train.batch_size // rows),
                random_base=config.model.hf is None and config.model.factory is None))
        finally:  # the probe's optimizer moments (Adam: twice the trained weights) go now, not with the run's
            step.optimizer.state.clear()
    elapsed = time.perf_counter() - started
    return worst_first([_timed(f, elapsed) if f.code.startswith("overfit_probe") else f for f in findings])


@contextmanager
def weights_kept(model: Any, *, restore: bool = True) -> Iterator[dict[str, torch.Tensor]]:
    """The probe trains the run's own model for a few steps: a copy of its trainable weights (only those: a frozen
    base cannot move, and copying it would cost the model's size again) is yielded, for the probe to tell whether
    they moved, and with the buffers put back afterwards, gradients cleared. `restore` False: a model built for
    the check alone, thrown away after it (nothing put back, no buffers copied)."""
    kept = trainable_snapshot(model)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()} if restore else {}
    try:
        yield kept
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if restore and name in kept:
                    p.copy_(kept[name])
                p.grad = None
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])


def split_data(name: str, dataset: Any, limit: int = MAX_ROWS) -> SplitData:
    """The first `limit` rows of a dataset as tensors: the whole-tensor fast path of ArrayDataset, a batched
    `__getitems__`, or sample by sample."""
    inputs, targets = getattr(dataset, "inputs", None), getattr(dataset, "targets", None)
    if isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor):
        return SplitData(name, inputs[:limit], targets[:limit])
    indices = list(range(min(len(dataset), limit)))
    if indices and isinstance(dataset[0], dict):  # token batches: ids and labels, about TOKENS_READ of them
        rows = max(1, TOKENS_READ // dataset[0]["input_ids"].shape[-1])
        samples = [dataset[i] for i in indices[:rows]]
        return SplitData(name, torch.stack([s["input_ids"] for s in samples]),
                         torch.stack([s["labels"] for s in samples]))
    if hasattr(dataset, "__getitems__"):
        inputs, targets = dataset.__getitems__(indices)
    else:
        pairs = [dataset[i] for i in indices]
        inputs = torch.stack([torch.as_tensor(x) for x, _ in pairs])
        targets = torch.stack([torch.as_tensor(y) for _, y in pairs])
    return SplitData(name, torch.as_tensor(inputs), torch.as_tensor(targets))


def _timed(finding: Finding, elapsed: float) -> Finding:
    return Finding(finding.code, finding.severity, finding.title, finding.detail,
                   {**finding.evidence, "check_seconds": elapsed}, finding.fixes, finding.step)


# A CPU run planned longer than this is said before its first step, with what would shorten it.
SLOW_CPU_RUN_S = 30 * 60


def slow_cpu_run(findings: list[Finding], *, batch_size: int, max_steps: int, threads: int,
                 full_softmax: bool = False) -> Finding | None:
    """A warning when the one-batch probe's pace says this CPU run takes over SLOW_CPU_RUN_S. The probe ran
    `steps` steps of `rows` rows on one thread; the estimate scales to the run's batch and divides by its
    threads (the best case: more threads rarely scale that well), so a warning is never a false alarm of
    scale."""
    probe = next((f for f in findings if f.code in ("overfit_probe", "overfit_probe_slow")), None)
    evidence = probe.evidence if probe is not None else {}
    if not all(isinstance(evidence.get(k), (int, float)) and evidence[k] > 0 for k in ("seconds", "steps", "rows")):
        return None
    per_step = evidence["seconds"] / evidence["steps"] * batch_size / evidence["rows"] / max(threads, 1)
    planned = per_step * max_steps
    if planned <= SLOW_CPU_RUN_S:
        return None
    hours = f"{planned / 3600:.1f} h" if planned >= 3600 else f"{planned / 60:.0f} min"
    levers = (["model.args.loss=sampled (a sampled softmax instead of scoring every item)"] if full_softmax else []) \
        + [f"fewer passes or steps (train.epochs / train.max_steps; now {max_steps:,} steps)",
           "a GPU: `trainwise plan RECIPE` says which card fits and what it costs"]
    return Finding(
        "slow_on_cpu", "warn", f"this run will take about {hours} on the CPU ({max_steps:,} steps); shorter: "
        + "; ".join(levers), f"The one-batch check ran at {per_step:.2f} s per step of {batch_size} samples (scaled "
        f"from {evidence['steps']} steps of {evidence['rows']} rows on one thread to {threads} threads).",
        {"planned_s": planned, "seconds_per_step": per_step, "max_steps": max_steps, "batch_size": batch_size,
         "threads": threads, "rule": f"planned > {SLOW_CPU_RUN_S / 60:.0f} min on the CPU"}, tuple(levers))
