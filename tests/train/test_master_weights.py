"""Full fine-tuning of bf16 weights keeps its updates: fp32 master weights by default (every weight moves at
lr 1e-5 on N(0, 0.02) weights), pure bf16 only on request (model.master_weights=none), and then the run warns
with the share of the first step's updates that bf16 lost."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.text.lm_helpers import tiny_gpt, token_batches
from trainwise.llm.methods import apply_model_config
from trainwise.train.step.master_weights import computing_precision, watch_lost_updates

STEPS, LR = 30, 1e-5


def bf16_gpt(master: str):
    model = tiny_gpt().to(torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
    config = SimpleNamespace(method="full", dtype="bf16", master_weights=master)
    return apply_model_config(model, config), config


def trained(master: str):
    """STEPS AdamW steps; the share of the weights with a gradient that moved, and the first step's reported
    share lost."""
    model, config = bf16_gpt(master)
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    reports = []
    watch_lost_updates(optimizer, model, config, lambda share, counted: reports.append(share))
    batch = token_batches()
    precision = computing_precision("fp32", config)
    for _ in range(STEPS):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(batch["input_ids"])
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten())
        loss.backward()
        if optimizer.state == {}:
            touched = [p.grad != 0 for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad()
    moved = sum(int(((p.detach() != s) & t).sum()) for p, s, t in zip(model.parameters(), start, touched))
    return model, moved / sum(int(t.sum()) for t in touched), reports


def test_fp32_master_weights_keep_small_updates():
    model, moved, reports = trained("fp32")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert moved > 0.95, moved
    assert reports == []  # nothing is lost, nothing to warn about


def test_pure_bf16_loses_updates_and_says_how_many():
    model, moved, reports = trained("none")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert moved < 0.5, moved
    assert len(reports) == 1 and reports[0] > 0.5, reports  # measured once, on the first step


def test_master_weights_compute_under_bf16_autocast_only_for_full_bf16():
    full = SimpleNamespace(method="full", dtype="bf16", master_weights="fp32")
    assert computing_precision("fp32", full) == "bf16"
    assert computing_precision("fp32", SimpleNamespace(method="lora", dtype="bf16", master_weights="fp32")) == "fp32"
    assert computing_precision("fp32", SimpleNamespace(method="full", dtype="fp32", master_weights="fp32")) == "fp32"
    assert computing_precision("fp16", full) == "fp16"
