"""The final weights file's format: a state dict as safetensors bytes that load with a plain `load_state_dict`
(layout.py writes the bytes atomically with their checksum; integrity.py reads them back and checks them)."""
from __future__ import annotations

from typing import Any


def safetensors_bytes(state_dict: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    """`state_dict` on the CPU as one safetensors file. Tied weights (an embedding that is also the output
    layer) share storage, which safetensors refuses: each name after the first gets its own copy."""
    from safetensors.torch import save

    tensors, seen = {}, set()
    for name, tensor in state_dict.items():
        tensor = tensor.detach().contiguous().cpu()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        tensors[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return save(tensors, metadata=metadata)
