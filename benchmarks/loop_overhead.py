"""What trainwise's loop costs over a minimal hand-written PyTorch loop doing the same work.

Same model (the digits CNN), data, precision, accumulation (2 micro-batches), AdamW, warmup + cosine and
gradient clipping. The hand loop slices tensors with a random permutation (the cheapest data path there is).
Both run alternately in one process; the figure is the median over rounds of each round's ratio of median
time per optimizer step, trainwise / hand loop (pairing within a round cancels the machine's drift).
Target ≤ 1.03 on CPU. When `lightning` is installed (`pip install -e .[bench]`), its Trainer runs the same job
in the same rounds for comparison.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise import ArrayDataset, Callback, DataSpec, RunDir, Trainer, config_from_dict  # noqa: E402
from trainwise.recipes.models import cnn  # noqa: E402
from trainwise.train.schedule import lr_factor  # noqa: E402

STEPS, WARMUP_STEPS, ROUNDS = 120, 15, 10
BATCH, MICRO = 64, 32
SPEC = DataSpec(input_shape=(1, 8, 8), num_classes=10)


def data():
    g = torch.Generator().manual_seed(0)
    return torch.rand(4096, 1, 8, 8, generator=g), torch.randint(0, 10, (4096,), generator=g)


def model():
    torch.manual_seed(0)
    return cnn(SPEC, channels=(32, 64), hidden=128, dropout=0.1)


class StepClock(Callback):
    def __init__(self):
        self.times = []

    def on_step_end(self, trainer):
        self.times.append(time.perf_counter())


def trainwise_loop(x, y) -> list[float]:
    config = config_from_dict({
        "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.01},
        "schedule": {"warmup_steps": 10, "decay": "cosine"},
        "train": {"max_steps": STEPS, "batch_size": BATCH, "micro_batch_size": MICRO, "precision": "fp32",
                  "grad_clip_norm": 1.0, "log_every": 50, "device": "cpu"},
        "eval": {"every_epoch": False}, "telemetry": {"enabled": False}})
    clock = StepClock()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model(), ArrayDataset(x, y), config=config, run_dir=RunDir.create(Path(tmp) / "r"),
                          callbacks=[clock], data_spec=SPEC)
        trainer.fit()
    return step_durations(clock.times)


def hand_loop(x, y) -> list[float]:
    net = model()
    decay = [p for p in net.parameters() if p.ndim >= 2]
    no_decay = [p for p in net.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup=10, max_steps=STEPS, decay="cosine", min_ratio=0.0))
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(0)
    order, cursor, times = torch.randperm(len(x), generator=generator), 0, []
    net.train()
    for _ in range(STEPS):
        for _ in range(BATCH // MICRO):
            if cursor + MICRO > len(x):
                order, cursor = torch.randperm(len(x), generator=generator), 0
            index = order[cursor:cursor + MICRO]
            cursor += MICRO
            loss = loss_fn(net(x[index]), y[index]) / (BATCH // MICRO)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter())
    return step_durations(times)


def lightning_loop(x, y) -> list[float] | None:
    try:
        import lightning as L
    except ImportError:
        return None
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    times: list[float] = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model()
            self.loss_fn = torch.nn.CrossEntropyLoss()

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            return self.loss_fn(self.net(inputs), targets)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if (batch_idx + 1) % (BATCH // MICRO) == 0:
                times.append(time.perf_counter())

        def configure_optimizers(self):
            decay = [p for p in self.parameters() if p.ndim >= 2]
            no_decay = [p for p in self.parameters() if p.ndim < 2]
            optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                           {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda s: lr_factor(s, warmup=10, max_steps=STEPS, decay="cosine", min_ratio=0.0))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    dataset = ArrayDataset(x, y)  # the same batched fetch trainwise gets
    sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(0)), MICRO, drop_last=True)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=lambda batch: batch)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, accumulate_grad_batches=BATCH // MICRO,
                            gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp)
        trainer.fit(Module(), loader)
    return step_durations(times)


def step_durations(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times[WARMUP_STEPS:], times[WARMUP_STEPS + 1:])]


def main() -> None:
    x, y = data()
    results: dict[str, list[float]] = {"trainwise": [], "hand_loop": [], "lightning": []}
    round_ratios: dict[str, list[float]] = {"trainwise": [], "lightning": []}
    for _ in range(ROUNDS):  # alternate so drift on a noisy machine hits all of them
        ours, hand, theirs = trainwise_loop(x, y), hand_loop(x, y), lightning_loop(x, y) or []
        results["trainwise"] += ours
        results["hand_loop"] += hand
        results["lightning"] += theirs
        round_ratios["trainwise"].append(statistics.median(ours) / statistics.median(hand))
        if theirs:
            round_ratios["lightning"].append(statistics.median(theirs) / statistics.median(hand))
    medians = {name: statistics.median(times) for name, times in results.items() if times}
    ratio = statistics.median(round_ratios["trainwise"])
    print(f"median step: trainwise {medians['trainwise'] * 1e3:.3f} ms, hand loop "
          f"{medians['hand_loop'] * 1e3:.3f} ms, ratio {ratio:.3f} (target ≤ 1.03)")
    lightning_ratio = statistics.median(round_ratios["lightning"]) if round_ratios["lightning"] else None
    if lightning_ratio:
        print(f"lightning {medians['lightning'] * 1e3:.3f} ms, ratio {lightning_ratio:.3f}")
    write_result("loop_overhead", {
        "description": __doc__.strip().splitlines()[0],
        "setup": {"model": "digits cnn (32, 64), hidden 128", "batch_size": BATCH, "micro_batch_size": MICRO,
                  "precision": "fp32", "steps_per_run": STEPS, "rounds": ROUNDS, "device": "cpu"},
        "median_step_s": medians, "ratio_trainwise_over_hand_loop": ratio,
        "round_ratios": round_ratios,
        "ratio_lightning_over_hand_loop": lightning_ratio, "target": 1.03,
        "meets_target": ratio <= 1.03,
    })


if __name__ == "__main__":
    main()
