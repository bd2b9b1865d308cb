"""The model and batches of a traced step, made of fake tensors: the model built on the meta device (or inside
the fake mode, for builders that work there), then every parameter and buffer replaced by a fake tensor of the
trace's mode, shared tensors (tied weights) staying shared; batches as the loader hands them."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from trainwise.plan.traced_step import TrainingStep


def build_on_meta(step: "TrainingStep") -> nn.Module:
    """The model built on the meta device, outside any fake mode: shapes without memory, where `.to(dtype)`,
    `.half()` and peft's wrappers work (FakeTensorMode cannot swap a module's parameters)."""
    with torch.device("meta"):
        return step.build_model()


def build_faked(step: "TrainingStep") -> nn.Module:
    """The model built inside the fake mode; a builder that casts or wraps its model cannot be (`Couldn't swap
    Linear.weight`), so it is then built again on the meta device."""
    try:
        return step.build_model()
    except RuntimeError as error:
        if "swap" not in str(error):
            raise
    with _outside_fake_mode():
        return build_on_meta(step)


def _outside_fake_mode():
    from torch.utils._python_dispatch import _disable_current_modes
    return _disable_current_modes()


def into_mode(model: nn.Module, mode) -> nn.Module:
    """Parameters and buffers that are not fake tensors of `mode` (a deepcopy inside the builder, as
    nn.TransformerEncoder does, gives its copies a fake mode of their own) are replaced by ones that are;
    shared tensors stay shared."""
    from torch._subclasses.fake_tensor import FakeTensor

    replaced: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None or (isinstance(tensor, FakeTensor) and tensor.fake_mode is mode):
                    continue
                if id(tensor) not in replaced:
                    fresh = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
                    if isinstance(tensor, nn.Parameter):
                        fresh = nn.Parameter(fresh, requires_grad=tensor.requires_grad)
                    replaced[id(tensor)] = fresh
                table[name] = replaced[id(tensor)]
    return model


def dense_gradients(model: nn.Module) -> nn.Module:
    """Sparse-gradient embedding tables traced as dense: fake tensors cannot run a sparse backward (its size
    depends on the ids). The gradient is overestimated (a whole table, not the rows looked up); the optimizer
    state is exact (SparseAdam keeps two dense moments, as AdamW)."""
    for module in model.modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            module.sparse = False
    return model


def make_batch(step: "TrainingStep", device: torch.device | str = "cpu"):
    shape = (step.micro_batch_size, *step.input_shape)
    if step.token_batches:  # the batch contract of text data: labels aligned with the outputs
        ids = torch.randint(0, step.vocabulary_size or 2, shape, device=device)
        positions = torch.arange(shape[-1], device=device).expand(shape).contiguous()
        batch = {"input_ids": ids, "labels": torch.randint(0, step.vocabulary_size or 2, shape, device=device),
                 "position_ids": positions}
        if step.host_document_lengths:
            batch["document_lengths"] = [[shape[-1]] for _ in range(shape[0])]
        return batch
    if step.input_dtype.is_floating_point:
        inputs = torch.randn(shape, dtype=step.input_dtype, device=device)
    else:
        inputs = torch.randint(0, step.vocabulary_size or 2, shape, dtype=step.input_dtype, device=device)
    target_shape = (step.micro_batch_size, *step.target_shape)
    if step.task == "classification":
        targets = torch.randint(0, step.num_classes or 2, target_shape, device=device)
    else:
        targets = torch.randn(target_shape, device=device)
    return inputs, targets


def largest_module_parameter_bytes(model: nn.Module) -> int:
    """The largest set of parameters one leaf-ish module owns directly (FSDP's unit of gathering)."""
    largest = 0
    for module in model.modules():
        own = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        largest = max(largest, own)
    return largest
