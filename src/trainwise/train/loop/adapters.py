"""What a LoRA run leaves: its adapter in peft's own format, loadable by `peft.PeftModel.from_pretrained`.

    RUN/adapter/adapter_model.safetensors   the adapter's weights (peft's names, no adapter name inside)
    RUN/adapter/adapter_config.json         rank, alpha, target modules, the base model's path

peft writes the files (its format is its business) into a temporary directory beside the run, which then
replaces `adapter/` in one rename, so a reader never sees half an adapter; their checksums go in
checksums.json like every other file of the run. The whole model's final weights are not needed for an
adapter: model.safetensors holds only what trained (runtime/model_state.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trainwise.rundir.adapter import write_adapter
from trainwise.llm.methods import find_peft_model

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir


def save_adapter(model: nn.Module, run_dir: "RunDir", base_model: str | None = None,
                 state: dict[str, Any] | None = None) -> Path | None:
    """Write RUN/adapter/ when `model` holds a peft adapter; its path, or None for other models. `state`: the
    weights to write, as plain tensors named from `model` down (the run's final weights: under FSDP gathered from
    the shards by every rank, as this runs on rank 0 alone); None: the model's own."""
    peft_model = find_peft_model(model)
    if peft_model is None:
        return None
    if base_model:
        for config in peft_model.peft_config.values():
            config.base_model_name_or_path = config.base_model_name_or_path or base_model
    if state is not None:  # peft names the weights from the peft model down; `model` may wrap it
        prefix = next(f"{name}." for name, module in model.named_modules() if module is peft_model).lstrip(".")
        state = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
    return write_adapter(run_dir, lambda tmp: peft_model.save_pretrained(str(tmp), state_dict=state))
