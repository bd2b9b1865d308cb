"""FSDP2 (`torch.distributed.fsdp.fully_shard`, train.strategy=fsdp): each block's parameters, gradients and
optimizer state are split across the ranks; a block's full parameters exist only while it computes.

Which modules are blocks, in this order of preference:
  1. your model's `fsdp_blocks()` method, returning the modules to shard one by one (the repeated layers:
     transformer blocks, residual stages). Parameters outside them go with the root;
  2. the built-in models' `blocks` and `head` (recipes/models.py, CheckpointedSequential);
  3. a Hugging Face model's repeated layers (the classes its `_no_split_modules` names: LlamaDecoderLayer...);
  4. otherwise the model's direct children that hold parameters.
A peft (LoRA) model's blocks are those of the model inside it: peft's wrappers call the inner model's forward
directly, past their own modules, so a wrapper sharded as a block would never be gathered. A block may mix
frozen base weights with trainable adapters: FSDP2 shards each parameter on its own and reduces gradients only
for those that have one.
The root is sharded last, for whatever is left. Each block is gathered, computed and freed in turn, so the
memory of full parameters is one block's, not the model's.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from trainwise.errors import ConfigError
from trainwise.llm.methods import find_peft_model


def fsdp_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules sharded one by one before the root (see the module docstring)."""
    peft_model = find_peft_model(model)
    if peft_model is not None:
        model = peft_model.get_base_model()
    hook = getattr(model, "fsdp_blocks", None)
    if callable(hook):
        blocks = list(hook())
        inside = {id(m) for m in model.modules()}
        strays = [type(b).__name__ for b in blocks if not isinstance(b, nn.Module) or id(b) not in inside
                  or b is model]
        if strays:
            raise ConfigError(f"{type(model).__name__}.fsdp_blocks() returned {', '.join(strays)}, which is not a "
                              "submodule of the model: return the model's own layers (e.g. `list(self.layers)`).")
        return blocks
    blocks_attr = getattr(model, "blocks", None)
    repeated = set(getattr(model, "_no_split_modules", None) or ())  # transformers' names for its layers
    if isinstance(blocks_attr, nn.ModuleList):
        candidates = [*blocks_attr, *([model.head] if isinstance(getattr(model, "head", None), nn.Module) else [])]
    elif repeated and any(_is_one_of(m, repeated) for m in model.modules()):
        candidates = [m for m in model.modules() if _is_one_of(m, repeated)]
    else:
        candidates = list(model.children())
    # a block without parameters (Flatten, ReLU) has nothing to shard; a frozen one (method=freeze, a LoRA
    # model's untouched head) is sharded too, or its weights would stay gathered with the root's
    return [m for m in candidates if any(True for _ in m.parameters())]


def _is_one_of(module: nn.Module, class_names: set[str]) -> bool:
    # by the class's lineage: a sharded module's class is FSDP's subclass of it (FSDPLlamaDecoderLayer)
    return any(cls.__name__ in class_names for cls in type(module).__mro__)


def shard_model(model: nn.Module, *, precision: str, cpu_offload: bool, device: torch.device) -> None:
    """Shard `model` in place over the default process group: each block, then the root."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if precision == "fp16":
        # GradScaler decides to skip a step from the local shard's gradients: ranks could disagree and diverge
        raise ConfigError("train.strategy=fsdp does not support train.precision=fp16; use bf16 (or fp32).")
    options: dict = {}
    if precision == "bf16":  # compute in bf16, reduce gradients in fp32 so that summing ranks loses nothing
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload and device.type != "cpu":  # training on the CPU already keeps everything in its memory
        options["offload_policy"] = CPUOffloadPolicy()
    for block in fsdp_blocks(model):
        fully_shard(block, **options)
    fully_shard(model, **options)


@contextmanager
def gradient_sync_off(model: nn.Module) -> Iterator[None]:
    """Accumulate this micro-batch's gradients unsharded, without the reduce-scatter; the last micro-batch of
    a step (outside this context) reduces the sum once."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]
