"""bf16 weights in full fine-tuning: the precision the forward computes in when fp32 master weights are held
(bf16 autocast, whatever train.precision asked), and, when pure bf16 weights were asked for
(model.master_weights=none), the share of the first optimizer step's updates that bf16 lost, measured on a sample
of each parameter and recorded as a warning event."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwise.llm.methods import holds_master_weights
from trainwise.runtime.precision import Precision

SAMPLE = 1 << 16  # elements watched per parameter: the measure costs no copy of the model


def computing_precision(precision: Precision, model_config: Any) -> Precision:
    """fp32 master weights compute under bf16 autocast (the user chose bf16 weights for their speed and memory)."""
    return "bf16" if precision == "fp32" and holds_master_weights(model_config) else precision


def watch_lost_updates(optimizer: torch.optim.Optimizer, model: nn.Module, model_config: Any, report) -> None:
    """Pure bf16 full fine-tuning: on the first optimizer step, `report(share, counted)` with the share of
    watched elements whose gradient was non-zero but whose bf16 value did not change."""
    if getattr(model_config, "method", "full") != "full" or getattr(model_config, "dtype", "fp32") != "bf16" \
            or holds_master_weights(model_config):
        return
    watched = [p for p in model.parameters() if p.requires_grad and p.dtype == torch.bfloat16]
    if not watched:
        return
    before: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def snapshot(*_: Any) -> None:
        before[:] = [(p, _sample(p).clone(), _sample(p.grad) != 0) for p in watched if p.grad is not None]

    def compare(*_: Any) -> None:
        pre.remove()
        post.remove()
        updated = sum(int(moving.sum()) for _, _, moving in before)
        lost = sum(int(((_sample(p) == old) & moving).sum()) for p, old, moving in before)
        before.clear()
        if updated:
            report(lost / updated, updated)

    pre = optimizer.register_step_pre_hook(snapshot)
    post = optimizer.register_step_post_hook(compare)


def record_lost_updates(run_dir: Any):
    """The `report` of watch_lost_updates: a warning event in the run's events.jsonl."""
    def report(share: float, counted: int) -> None:
        run_dir.log_event("bf16_updates_lost", f"pure bf16 weights (model.master_weights=none): {share:.1%} of "
                          "the first step's non-zero updates left their bf16 weight unchanged (smaller than bf16's "
                          "resolution). model.master_weights=fp32 (the default) keeps them.", severity="warning",
                          step=1, evidence={"lost_share": share, "elements_counted": counted})
    return report


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # FSDP2: this rank's shard
    return local.detach().reshape(-1)[:SAMPLE]
