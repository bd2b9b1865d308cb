"""Which part of a traced training step the allocation tracker is in, and what each new tensor is.

Parts: forward/backward of the micro-batches, and the optimizer step (clipping, update, zero_grad). Inside
the micro-batches, four regions of a model built of a stack of blocks (a transformer's layers): forward;
backward of the head (the loss and output layer, every block's activations still held); backward of the
blocks; backward below them (every block's gradient held, the embedding's being made). Within each region
the live memory at its highest point grows linearly with the number of blocks (blocks are alike), while
the highest of the four need not: llm_estimate.py extends each region's peak from two traced depths to the real
depth and only then takes the largest (the peak of a shallow trace can fall in another region than the
deep model's: a checkpointed GPT-2 peaks in backward at 1-2 blocks, at the end of forward at 4).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from trainwise.plan.allocation_tracker import BELOW, BLOCKS, FORWARD, HEAD, AllocationTracker

if TYPE_CHECKING:
    from trainwise.train.step.train_step import TrainStep


def label_gradients(tracker: "AllocationTracker", parameters: list[nn.Parameter]) -> None:
    # a gradient is a temporary of backward until autograd stores it in .grad
    for p in parameters:
        p.register_post_accumulate_grad_hook(lambda param: tracker.track(param.grad, "gradients"))


def run_labelled(tracker: "AllocationTracker", train_step: "TrainStep", computed: list,
                 device_batches: list) -> None:
    """One optimizer step over the `computed` micro-batches. Forward outputs are activations, everything
    made in backward and the optimizer temporaries; the optimizer's moments are relabelled as optimizer state
    once it has made them. `device_batches`: batches that are device memory for the whole step (on a CPU)."""
    for batch in device_batches:
        for tensor in (batch.values() if isinstance(batch, dict) else batch):
            if isinstance(tensor, torch.Tensor):  # not the host's document lengths (a list)
                tracker.track(tensor, "activations")
    model = train_step.model

    def forward_phase(_module, _args):
        tracker.phase, tracker.region = "activations", FORWARD

    def backward_phase_after(_module, _args, output):
        # backward of the model starts when the gradient of its output arrives
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: _enter(tracker, HEAD, "temporaries"))

    handles = [model.register_forward_pre_hook(forward_phase),
               model.register_forward_hook(backward_phase_after), *_block_regions(tracker, model)]
    pre = register_optimizer_step_pre_hook(lambda *_: tracker.enter_optimizer())
    post = register_optimizer_step_post_hook(lambda opt, *_: _label_state(tracker, opt))
    # which module runs, for where the peak falls (a hook that keeps no tensors: torch's ModuleTracker would
    # keep checkpointed activations alive, as FlopCounterMode does)
    names = {id(module): name for name, module in model.named_modules()}
    handles.append(torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, _args: setattr(tracker, "module", names.get(id(module), tracker.module))))
    try:
        train_step.update(train_step.accumulate(computed))
    finally:
        for handle in (*handles, pre, post):
            handle.remove()
        tracker.phase, tracker.region = "activations", ""


def _enter(tracker: "AllocationTracker", region: str, phase: str | None = None) -> None:
    tracker.region = region
    if phase is not None:
        tracker.phase = phase


def _block_regions(tracker: "AllocationTracker", model: nn.Module) -> list:
    """Hooks on the last block's output and the first block's input: their gradients arriving open the
    backward of the blocks and the backward below them (tensor hooks: they keep nothing alive)."""
    blocks = _block_stack(model)
    if blocks is None:
        return []

    def on_tensor(region):
        def attach(value):
            tensor = next((t for t in (value if isinstance(value, (tuple, list)) else (value,))
                           if isinstance(t, torch.Tensor)), None)
            if tensor is not None and tensor.requires_grad:
                tensor.register_hook(lambda grad: _enter(tracker, region))
        return attach

    below, blocks_start = on_tensor(BELOW), on_tensor(BLOCKS)
    return [blocks[0].register_forward_pre_hook(
                lambda _m, args, kwargs: below(args if args else kwargs.get("hidden_states")), with_kwargs=True),
            blocks[-1].register_forward_hook(lambda _m, _args, output: blocks_start(output))]


def _block_stack(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of blocks (its ModuleList of the most parameters), if it has one of two or more."""
    from trainwise.llm.methods import transformer_blocks
    if not any(isinstance(m, nn.ModuleList) for m in model.modules()):
        return None
    blocks = transformer_blocks(model)
    return blocks if len(blocks) >= 1 else None


def _label_state(tracker: "AllocationTracker", optimizer: torch.optim.Optimizer) -> None:
    tracker.in_optimizer = False
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                tracker.track(value, "optimizer_state")
