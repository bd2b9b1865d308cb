"""What a whole trainwise run costs over a hand-written PyTorch loop doing the same job, with Lightning
in the same rounds.

The job is the `digits` recipe as a user runs it (`trainwise train digits`), early stopping off so every
run takes its 600 steps: the digits CNN, batch 64, AdamW with decay groups, warmup + cosine, clipping at
1.0, label smoothing 0.05, the recipe's random-shift augmentation, a log line every 20 steps, validation
and a checkpoint every 100 steps (keep 2) and at the end, the final weights saved. trainwise runs through
`build_trainer` + `Trainer.fit()`, its loader as the recipe resolves it. The hand loop does the same work
with the least machinery: tensor slicing by a permutation, `loss.item()` at log steps, `torch.save` of
model + optimizer + scheduler to a temp file renamed into place. Lightning gets the same data, loader
workers, logging, validation and checkpoint cadence.

Each round runs all three once, in turn, so the machine's drift hits them alike; the figure is the median
over ≥10 rounds of each round's ratio of whole-run wall time, trainwise / hand loop, with its spread. Beside
it: host syncs per step between log steps, counted in one more trainwise run (HostSyncCounter).
Target: median ratio ≤ 1.03.

    .venv/bin/python benchmarks/loop_overhead.py [--rounds 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise.recipes import load_recipe  # noqa: E402
from trainwise.recipes.factories import build_data, build_model  # noqa: E402
from trainwise.rundir.layout import RunDir  # noqa: E402
from trainwise.train.loop.host_syncs import HostSyncCounter  # noqa: E402
from trainwise.train.step.optim import parameter_groups  # noqa: E402
from trainwise.launch.runs import build_trainer  # noqa: E402
from trainwise.runtime.seed import seed_everything  # noqa: E402
from trainwise.train.step.schedule import lr_factor  # noqa: E402

# early stopping off: every run takes the same 600 steps. Validation at epoch ends off: the recipe also
# validates every 100 steps, a schedule the hand loop and Lightning can follow exactly. The sanity checks
# `train` runs before the first step (a one-off, not loop overhead, and work the others do not do) are
# timed apart and reported beside the ratio.
OVERRIDES = ["eval.early_stopping.enabled=false", "eval.every_epoch=false", "telemetry.enabled=false",
             "train.device=cpu", "train.sanity=false"]


def recipe():
    return load_recipe("digits", OVERRIDES)


def run_trainwise(config, tmp: Path, callbacks=()) -> float:
    started = time.perf_counter()
    run = RunDir(tmp / "trainwise")
    trainer = build_trainer(config, run, callbacks)
    run.initialise(overwrite=True)
    trainer.fit()
    return time.perf_counter() - started


def run_hand_loop(config, tmp: Path) -> float:
    started = time.perf_counter()
    seed_everything(config.seed)
    bundle = build_data(config)
    net = build_model(config, bundle.spec)
    train, val = bundle.train, bundle.val
    x, y = train.inputs, train.targets
    optimizer = torch.optim.AdamW(parameter_groups(net, config.optim.weight_decay), lr=config.optim.lr)
    steps, batch, warmup = config.train.max_steps, config.train.batch_size, config.schedule.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup=warmup, max_steps=steps, decay="cosine", min_ratio=0.0))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=config.train.label_smoothing)
    generator = torch.Generator().manual_seed(config.seed)
    order, cursor = torch.randperm(len(x), generator=generator), 0
    out = tmp / "hand"
    out.mkdir(exist_ok=True)
    log = open(out / "log.jsonl", "w")
    saved: list[Path] = []
    running = torch.zeros(())
    for step in range(1, steps + 1):
        net.train()
        if cursor + batch > len(x):
            order, cursor = torch.randperm(len(x), generator=generator), 0
        index = order[cursor:cursor + batch]
        cursor += batch
        inputs = bundle.augment(x[index]) if bundle.augment else x[index]
        loss = loss_fn(net(inputs), y[index])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), config.train.grad_clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        running += loss.detach()
        if step % config.train.log_every == 0:
            log.write(json.dumps({"step": step, "loss": running.item() / config.train.log_every}) + "\n")
            log.flush()
            running.zero_()
        if step % config.eval.every_steps == 0 or step == steps:
            net.eval()
            with torch.no_grad():
                logits = torch.cat([net(val.inputs[i:i + 256]) for i in range(0, len(val), 256)])
                accuracy = (logits.argmax(1) == val.targets).float().mean().item()
            log.write(json.dumps({"step": step, "val_accuracy": accuracy}) + "\n")
            path = out / f"step-{step}.pt"
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "step": step}, out / "tmp.pt")
            os.replace(out / "tmp.pt", path)
            saved.append(path)
            while len(saved) > config.checkpoint.keep_last:
                saved.pop(0).unlink()
    torch.save(net.state_dict(), out / "final.pt")
    log.close()
    return time.perf_counter() - started


def run_lightning(config, tmp: Path, workers: int) -> float | None:
    try:
        import lightning as L
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger
    except ImportError:
        return None
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    started = time.perf_counter()
    seed_everything(config.seed)
    bundle = build_data(config)
    steps = config.train.max_steps

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = build_model(config, bundle.spec)
            self.loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=config.train.label_smoothing)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            if bundle.augment:
                inputs = bundle.augment(inputs)
            loss = self.loss_fn(self.net(inputs), targets)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            inputs, targets = batch
            self.log("val_accuracy", (self.net(inputs).argmax(1) == targets).float().mean())

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(parameter_groups(self.net, config.optim.weight_decay), lr=config.optim.lr)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(
                s, warmup=config.schedule.warmup_steps, max_steps=steps, decay="cosine", min_ratio=0.0))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def loader(dataset, shuffle):
        sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(0)) if shuffle
                               else range(len(dataset)), config.train.batch_size if shuffle else 256,
                               drop_last=shuffle)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=lambda b: b, num_workers=workers,
                          persistent_workers=workers > 0)

    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1,
                        gradient_clip_val=config.train.grad_clip_norm, logger=CSVLogger(tmp / "lightning"),
                        log_every_n_steps=config.train.log_every, val_check_interval=config.eval.every_steps,
                        check_val_every_n_epoch=None, num_sanity_val_steps=0, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp / "lightning",
                        callbacks=[ModelCheckpoint(dirpath=tmp / "lightning" / "ckpt",
                                                   every_n_train_steps=config.eval.every_steps,
                                                   save_top_k=config.checkpoint.keep_last, monitor="step",
                                                   mode="max")])
    trainer.fit(Module(), loader(bundle.train, True), loader(bundle.val, False))
    return time.perf_counter() - started


def count_host_syncs(config, tmp: Path) -> dict:
    counter = HostSyncCounter()
    with counter:
        run_trainwise(config, tmp, [counter.step_marker()])
    steps = config.train.max_steps
    run = RunDir(tmp / "trainwise")
    # settle points: where the run logged a train or val record, or wrote a checkpoint
    settle = {record["step"] for split in ("train", "val") for record in run.read_metrics(split)}
    settle |= {s for s in range(1, steps + 1) if config.checkpoint.every_steps and s % config.checkpoint.every_steps == 0}
    total = sum(len(calls) for step, calls in counter.by_step.items() if step > 0)
    return {"per_step_between_log_steps": counter.syncs_between(settle, steps),
            "per_step_overall": total / steps, "settle_points": len(settle)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    config = recipe()
    from trainwise.data.loader import choose_loader_settings

    workers = choose_loader_settings(torch.device("cpu"), config.data.num_workers, config.data.pin_memory).num_workers
    walls: dict[str, list[float]] = {"trainwise": [], "hand_loop": [], "lightning": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        run_trainwise(config, tmp)  # warm-up: imports, first-touch of the data
        for round_index in range(args.rounds):
            walls["trainwise"].append(run_trainwise(config, tmp))
            walls["hand_loop"].append(run_hand_loop(config, tmp))
            lightning = run_lightning(config, tmp, workers)
            if lightning is not None:
                walls["lightning"].append(lightning)
            print(f"round {round_index + 1}: trainwise {walls['trainwise'][-1]:.2f} s, hand loop "
                  f"{walls['hand_loop'][-1]:.2f} s" + (f", lightning {lightning:.2f} s" if lightning else ""),
                  flush=True)
        syncs = count_host_syncs(config, tmp)
    from trainwise.check.sanity import sanity_check

    started = time.perf_counter()
    sanity_check(config)
    sanity_s = time.perf_counter() - started
    ratios = [a / b for a, b in zip(walls["trainwise"], walls["hand_loop"])]
    lightning_ratios = [a / b for a, b in zip(walls["lightning"], walls["hand_loop"])]
    ratio = statistics.median(ratios)
    spread = {"min": min(ratios), "max": max(ratios),
              "quartiles": statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else ratios}
    print(f"whole run: trainwise / hand loop median {ratio:.3f} (rounds {spread['min']:.3f}–{spread['max']:.3f}); "
          f"host syncs per step between log steps: {syncs['per_step_between_log_steps']:.2f}")
    if lightning_ratios:
        print(f"lightning / hand loop median {statistics.median(lightning_ratios):.3f}")
    write_result("loop_overhead", {
        "description": __doc__.strip().splitlines()[0],
        "setup": {"recipe": "digits", "overrides": OVERRIDES, "steps_per_run": config.train.max_steps,
                  "log_every": config.train.log_every, "eval_and_checkpoint_every": config.eval.every_steps,
                  "rounds": args.rounds, "loader_workers": workers, "device": "cpu"},
        "wall_s": walls, "median_wall_s": {k: statistics.median(v) for k, v in walls.items() if v},
        "ratio_trainwise_over_hand_loop": ratio, "ratio_spread": spread, "round_ratios": ratios,
        "ratio_lightning_over_hand_loop": statistics.median(lightning_ratios) if lightning_ratios else None,
        "host_syncs": syncs, "sanity_check_s_once_before_training": sanity_s,
        "targets": {"ratio_trainwise_over_hand_loop": 1.03, "host_syncs_per_step_between_log_steps": 0},
        "meets_targets": ratio <= 1.03 and syncs["per_step_between_log_steps"] == 0,
    })


if __name__ == "__main__":
    main()
