"""Planner accuracy: the peak memory `trainwise plan` predicts for a training step, against the peak the
allocator really reached while trainwise's own Trainer ran its first two optimizer steps, over MLPs, the
digits CNN, a ResNet-18-style CNN, a small transformer, LSTM/GRU classifiers, an encoder-decoder CNN with
transposed convolutions and skip concatenations, multi-head attention, Conv1d and EmbeddingBag models, in
fp32 and bf16 autocast, with gradient checkpointing and accumulation.

Measured (the truth): `Trainer.fit()` on real data for two steps (its loss, clipping, scaler, accumulation,
loader), the model built inside the measurement. On CPU, torch.profiler's allocation events (every byte the
CPU allocator hands out and takes back, replayed in order), the peak of the running total inside the
Trainer's `trainwise.train_step` ranges; on CUDA, torch.cuda.max_memory_allocated over the same two steps.
Estimated: trainwise.plan.memory.trace_step on fake tensors (no memory allocated).
In the same table, the naive estimate of accelerate's / DeepSpeed's estimators: weights + gradients + Adam
moments (4 × parameter bytes), no activations.

    .venv/bin/python benchmarks/plan_accuracy.py            # CPU (or CUDA when present)
    .venv/bin/python benchmarks/plan_accuracy.py --device cpu
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise import ArrayDataset, DataSpec, RunDir, Trainer, config_from_dict  # noqa: E402
from trainwise.plan.memory import trace_step  # noqa: E402
from trainwise.plan.traced_step import TrainingStep  # noqa: E402
from trainwise.plan.probe import peak_bytes  # noqa: E402
from trainwise.recipes.models import CheckpointedSequential  # noqa: E402
from trainwise.train.step.train_step import STEP_RANGE  # noqa: E402


# ---- models -------------------------------------------------------------------------------------------------

def mlp(width: int = 30, hidden: tuple[int, ...] = (512, 512, 256), classes: int = 2, checkpointing=False):
    blocks, size = [], width
    for h in hidden:
        blocks.append(nn.Sequential(nn.Linear(size, h), nn.ReLU(), nn.Dropout(0.1)))
        size = h
    return CheckpointedSequential(blocks, nn.Linear(size, classes), checkpointing)


def digits_cnn(checkpointing=False):
    from trainwise.data.bundle import DataSpec
    from trainwise.recipes.models import cnn

    spec = DataSpec(input_shape=(1, 8, 8), num_classes=10)
    return cnn(spec, channels=(32, 64), hidden=128, dropout=0.1, gradient_checkpointing=checkpointing)


class BasicBlock(nn.Module):
    """ResNet's two 3×3 convolutions with batch norm and a shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet18_style(width: int = 16, classes: int = 10, checkpointing=False):
    """ResNet-18's layout (2-2-2-2 basic blocks, 4 stages) at a quarter of its width, for 32×32 images."""
    stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
    blocks, channels = [stem], width
    for stage, multiple in enumerate((1, 2, 4, 8)):
        for index in range(2):
            stride = 2 if stage > 0 and index == 0 else 1
            blocks.append(BasicBlock(channels, width * multiple, stride))
            channels = width * multiple
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))
    return CheckpointedSequential(blocks, head, checkpointing)


class TokenEmbedding(nn.Module):
    def __init__(self, vocabulary: int, width: int, length: int):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Parameter(torch.zeros(1, length, width))

    def forward(self, tokens):
        return self.tokens(tokens) + self.positions


class MeanPoolHead(nn.Module):
    def __init__(self, width: int, classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        return self.out(self.norm(x).mean(dim=1))


def transformer(vocabulary=1000, length=64, width=128, layers=2, heads=4, classes=4, checkpointing=False):
    """A pre-norm encoder classifier (token + position embedding, self-attention, GELU MLP, mean pool)."""
    blocks = [TokenEmbedding(vocabulary, width, length)]
    blocks += [nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, activation="gelu",
                                          batch_first=True, norm_first=True) for _ in range(layers)]
    return CheckpointedSequential(blocks, MeanPoolHead(width, classes), checkpointing)


class RecurrentClassifier(nn.Module):
    """Tokens -> embedding -> a multi-layer LSTM or GRU -> the last step (or the mean, bidirectional)."""

    def __init__(self, kind="lstm", vocabulary=1000, width=64, layers=2, bidirectional=False, classes=4):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        rnn = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = rnn(width, width, layers, batch_first=True, bidirectional=bidirectional, dropout=0.1)
        self.head = nn.Linear(width * (2 if bidirectional else 1), classes)

    def forward(self, tokens):
        out, _ = self.rnn(self.embedding(tokens))
        return self.head(out.mean(1) if self.rnn.bidirectional else out[:, -1])


def lstm(checkpointing=False):
    return RecurrentClassifier("lstm")


def gru_bidirectional(checkpointing=False):
    return RecurrentClassifier("gru", bidirectional=True)


class EncoderDecoderCNN(nn.Module):
    """A small U-Net: strided convolutions down, transposed convolutions up, skips concatenated, then a
    classifier over the decoded map (the shape segmentation models have, with a cheap head)."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        block = lambda a, b, stride=1: nn.Sequential(  # noqa: E731
            nn.Conv2d(a, b, 3, stride, 1), nn.BatchNorm2d(b), nn.ReLU())
        self.enc1, self.enc2, self.enc3 = block(3, width), block(width, 2 * width, 2), block(2 * width, 4 * width, 2)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = block(2 * width, width)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(e1)
        d2 = self.dec2(torch.cat([self.up2(self.enc3(e2)), e2], 1))
        return self.head(self.dec1(torch.cat([self.up1(d2), e1], 1)))


def encoder_decoder(checkpointing=False):
    return EncoderDecoderCNN()


class AttentionPool(nn.Module):
    """Tokens -> embedding -> nn.MultiheadAttention (self-attention) -> LayerNorm -> mean -> classes."""

    def __init__(self, vocabulary=1000, width=64, heads=4, classes=4):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=0.1, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        x = self.embedding(tokens)
        attended, _ = self.attention(x, x, x, need_weights=False)
        return self.head(self.norm(x + attended).mean(1))


def attention(checkpointing=False):
    return AttentionPool()


class TokenConv1d(nn.Module):
    def __init__(self, vocabulary=1000, width=64, classes=4):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.convs = nn.Sequential(nn.Conv1d(width, 128, 5, padding=2), nn.GroupNorm(8, 128), nn.GELU(),
                                   nn.MaxPool1d(2), nn.Conv1d(128, 128, 3, padding=1, groups=4), nn.ReLU())
        self.head = nn.Linear(128, classes)

    def forward(self, tokens):
        return self.head(self.convs(self.embedding(tokens).transpose(1, 2)).amax(-1))


def conv1d(checkpointing=False):
    return TokenConv1d()


class BagOfTokens(nn.Module):
    def __init__(self, vocabulary=5000, width=128, classes=4):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocabulary, width, mode="mean")
        self.head = nn.Sequential(nn.Linear(width, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, classes))

    def forward(self, tokens):
        return self.head(self.bag(tokens))


def bag_of_tokens(checkpointing=False):
    return BagOfTokens()


class KeywordSpotter(nn.Module):
    """Held out (issue 26: the planner had never seen it): a raw-waveform keyword spotter, a long-kernel
    strided Conv1d front end over 16,000 samples (one second at 16 kHz), three strided Conv1d, GroupNorm
    and GELU, mean over time, a linear head."""

    def __init__(self, width=32, classes=12):
        super().__init__()
        layers, channels = [nn.Conv1d(1, width, 80, stride=4), nn.GroupNorm(4, width), nn.GELU()], width
        for out in (width, 2 * width, 2 * width):
            layers += [nn.Conv1d(channels, out, 3, stride=2), nn.GroupNorm(4, out), nn.GELU()]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, waveform):
        return self.head(self.features(waveform).mean(-1))


def keyword_spotter(checkpointing=False):
    return KeywordSpotter()


# ---- configurations ---------------------------------------------------------------------------------------

def configurations() -> list[tuple[str, TrainingStep]]:
    def step(builder, shape, classes, batch, precision="fp32", checkpointing=False, **extra):
        return TrainingStep(build_model=lambda: builder(checkpointing=checkpointing), input_shape=shape,
                            num_classes=classes, micro_batch_size=batch, precision=precision,
                            grad_clip_norm=1.0, optimizer_args={"lr": 1e-3, "weight_decay": 0.01}, **extra)

    tokens = dict(input_dtype=torch.long, vocabulary_size=1000)
    return [
        ("mlp fp32 b=64", step(mlp, (30,), 2, 64)),
        ("mlp fp32 b=1024", step(mlp, (30,), 2, 1024)),
        ("mlp bf16 b=1024", step(mlp, (30,), 2, 1024, "bf16")),
        ("mlp fp32 b=1024 ckpt", step(mlp, (30,), 2, 1024, checkpointing=True)),
        ("digits-cnn fp32 b=64", step(digits_cnn, (1, 8, 8), 10, 64)),
        ("digits-cnn fp32 b=256", step(digits_cnn, (1, 8, 8), 10, 256)),
        ("digits-cnn fp32 b=256 ckpt", step(digits_cnn, (1, 8, 8), 10, 256, checkpointing=True)),
        ("digits-cnn bf16 b=64", step(digits_cnn, (1, 8, 8), 10, 64, "bf16")),
        ("resnet18-style fp32 b=8", step(resnet18_style, (3, 32, 32), 10, 8)),
        ("resnet18-style fp32 b=16", step(resnet18_style, (3, 32, 32), 10, 16)),
        ("resnet18-style fp32 b=16 ckpt", step(resnet18_style, (3, 32, 32), 10, 16, checkpointing=True)),
        ("resnet18-style bf16 b=8", step(resnet18_style, (3, 32, 32), 10, 8, "bf16")),
        ("transformer fp32 b=8", step(transformer, (64,), 4, 8, **tokens)),
        ("transformer fp32 b=32", step(transformer, (64,), 4, 32, **tokens)),
        ("transformer fp32 b=32 ckpt", step(transformer, (64,), 4, 32, checkpointing=True, **tokens)),
        ("transformer bf16 b=32", step(transformer, (64,), 4, 32, "bf16", **tokens)),
        ("transformer bf16 b=32 ckpt", step(transformer, (64,), 4, 32, "bf16", checkpointing=True, **tokens)),
        ("mlp fp32 b=256 accum=4", step(mlp, (30,), 2, 256, accumulation_steps=4)),
        ("lstm-2layer fp32 b=16", step(lstm, (32,), 4, 16, **tokens)),
        ("lstm-2layer bf16 b=16", step(lstm, (32,), 4, 16, "bf16", **tokens)),
        ("gru-bidirectional fp32 b=16", step(gru_bidirectional, (32,), 4, 16, **tokens)),
        ("encoder-decoder-cnn fp32 b=8", step(encoder_decoder, (3, 32, 32), 10, 8)),
        ("encoder-decoder-cnn bf16 b=8", step(encoder_decoder, (3, 32, 32), 10, 8, "bf16")),
        ("multihead-attention fp32 b=16", step(attention, (64,), 4, 16, **tokens)),
        ("conv1d-grouped fp32 b=32", step(conv1d, (64,), 4, 32, **tokens)),
        ("embedding-bag fp32 b=64 accum=2", step(bag_of_tokens, (40,), 4, 64, accumulation_steps=2,
                                                 input_dtype=torch.long, vocabulary_size=5000)),
        ("kws-conv1d fp32 b=16 (held out)", step(keyword_spotter, (1, 16000), 12, 16)),
        ("kws-conv1d bf16 b=16 (held out)", step(keyword_spotter, (1, 16000), 12, 16, "bf16")),
    ]


def trainer_peak_bytes(step: TrainingStep, device: torch.device) -> int:
    """The peak while trainwise's Trainer runs its first two optimizer steps of `step`'s job."""
    batch = step.micro_batch_size * step.accumulation_steps
    g = torch.Generator().manual_seed(0)
    shape = (3 * batch, *step.input_shape)
    inputs = (torch.randn(shape, generator=g) if step.input_dtype.is_floating_point
              else torch.randint(0, step.vocabulary_size or 2, shape, generator=g))
    data = ArrayDataset(inputs, torch.randint(0, step.num_classes or 2, (3 * batch,), generator=g))
    config = config_from_dict({
        "optim": {"name": step.optimizer, **step.optimizer_args},
        "train": {"max_steps": 2, "batch_size": batch, "micro_batch_size": step.micro_batch_size,
                  "precision": step.precision, "grad_clip_norm": step.grad_clip_norm, "device": str(device),
                  "log_every": 1},
        "data": {"num_workers": 0}, "eval": {"every_epoch": False, "every_steps": None},
        "checkpoint": {"every_steps": None}, "telemetry": {"enabled": False}}, source="plan_accuracy")
    spec = DataSpec(input_shape=step.input_shape, num_classes=step.num_classes, input_dtype=step.input_dtype)
    with tempfile.TemporaryDirectory() as tmp:
        def fit() -> None:
            model = step.build_model()  # inside the measurement: its parameters are part of the peak
            Trainer(model, data, config=config, run_dir=RunDir.create(Path(tmp) / "run"), data_spec=spec).fit()

        # the peak inside the Trainer's train-step ranges (on CUDA: over the whole fit, steps dominate)
        return peak_bytes(fit, device, within=STEP_RANGE)


def naive_bytes(trace) -> int:
    """accelerate / DeepSpeed-style: weights + gradients + two Adam moments, no activations."""
    return 4 * trace.parameter_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", help="run the configurations whose name contains this (no result written)")
    args = parser.parse_args()
    device = torch.device(args.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    torch.manual_seed(0)
    if device.type == "cuda":
        # cuBLAS/cuDNN workspaces are per-device fixed costs (advise.py), not part of a step: create them
        # before measuring, so each measurement starts with them already allocated
        x = torch.ones(64, 64, device=device)
        (x @ x).sum().item()
        torch.nn.functional.conv2d(x[None, None], torch.ones(1, 1, 3, 3, device=device)).sum().item()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            (x @ x).sum().item()
    rows = []
    started = time.perf_counter()
    for name, step in configurations():
        if args.only and args.only not in name:
            continue
        step = step.on(kind)
        t0 = time.perf_counter()
        trace = trace_step(step)
        t1 = time.perf_counter()
        measured = trainer_peak_bytes(step, device)
        t2 = time.perf_counter()
        naive = naive_bytes(trace)
        rows.append({
            "config": name, "micro_batch_size": step.micro_batch_size, "precision": step.precision,
            "parameters": trace.parameter_count, "measured_bytes": measured, "estimated_bytes": trace.peak_bytes,
            "error": trace.peak_bytes / measured - 1, "naive_bytes": naive, "naive_error": naive / measured - 1,
            "breakdown": trace.breakdown, "trace_s": round(t1 - t0, 3), "measure_s": round(t2 - t1, 3)})
        print(f"{name:32s} measured {measured / 2**20:9.2f} MiB  estimated {trace.peak_bytes / 2**20:9.2f} MiB "
              f"({rows[-1]['error']:+7.2%})  naive {naive / 2**20:8.2f} MiB ({rows[-1]['naive_error']:+8.2%})",
              flush=True)
    errors = [abs(r["error"]) for r in rows]
    naive_errors = [abs(r["naive_error"]) for r in rows]
    summary = {"configs": len(rows), "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
               "naive_median_abs_error": statistics.median(naive_errors),
               "naive_max_abs_error": max(naive_errors), "target": {"median_abs_error": 0.05,
                                                                    "max_abs_error": 0.10},
               "wall_s": round(time.perf_counter() - started, 1)}
    summary["meets_targets"] = summary["median_abs_error"] <= 0.05 and summary["max_abs_error"] <= 0.10
    print(f"median |error| {summary['median_abs_error']:.2%}, max {summary['max_abs_error']:.2%} "
          f"(naive: median {summary['naive_median_abs_error']:.2%}, max {summary['naive_max_abs_error']:.2%})")
    if args.only:
        return
    write_result("plan_accuracy", {
        "device": str(device), "truth": "trainwise.Trainer.fit(), its first two optimizer steps",
        "measurement": "torch.cuda.max_memory_allocated" if kind == "cuda"
        else "torch.profiler allocation events (CPU allocator), peak of the running total inside the "
             "Trainer's train-step ranges",
        "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
