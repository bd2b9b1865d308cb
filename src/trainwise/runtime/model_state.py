"""What a run keeps of its model, and how it loads back.

A model whose base is frozen (LoRA adapters, `method: freeze`, QLoRA) changes only in what trains: its
checkpoints and final weights hold those tensors and the buffers, not the base. Resuming or evaluating rebuilds
the base from where it came from (the model directory, or the config and the run's seed) and loads the rest on
top. The base is fingerprinted when saved, so weights are never put on a different base without a word.
A model with nothing frozen keeps its whole state dict, exactly as before.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

SCOPE_KEY = "weights_scope"          # in checkpoints and in model.safetensors' metadata
FINGERPRINT_KEY = "frozen_fingerprint"


def frozen_names(model: nn.Module) -> set[str]:
    """State-dict names of the parameters that do not train (tied weights under every name they have)."""
    return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def kept_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict a checkpoint keeps: all of it, less the frozen parameters."""
    frozen = frozen_names(model)
    return {k: v for k, v in model.state_dict().items() if k not in frozen}


def frozen_fingerprint(model: nn.Module) -> str:
    """A cheap identity of the frozen base: count, and sums in float64 (one pass; a host sync, so call it at
    save time only). Empty when nothing is frozen. Under FSDP each rank sums its shards and one all-reduce adds
    them up: a collective, so every rank calls it."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    if not frozen:
        return ""
    sums = torch.zeros(2, dtype=torch.float64, device=_local(frozen[0]).device)
    for p in frozen:
        values = _local(p).detach().to(torch.float64)
        sums += torch.stack([values.sum(), values.square().sum()]).to(sums.device)
    group = next((p.device_mesh.get_group() for p in frozen if _local(p) is not p), None)
    if group is not None:
        sums = _summed_over(group, sums)
    total, squares = sums.tolist()
    return f"{len(frozen)} tensors, {sum(p.numel() for p in frozen)} values, sum {total!r}, " \
           f"sum of squares {squares!r}"


def _local(parameter: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP-sharded parameter (a DTensor); any other tensor itself."""
    to_local = getattr(parameter, "to_local", None)
    return to_local() if callable(to_local) else parameter


def _summed_over(group: Any, sums: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    total = sums.to(device)
    dist.all_reduce(total, group=group)
    return total.cpu()


def same_base(saved: str, now: str) -> bool:
    """Fingerprints agree: the same counts, sums equal to 1e-9 (the summation order differs across devices
    and thread counts, so the last bits may)."""
    import math
    import re

    def numbers(text: str) -> list[float]:
        return [float(x) for x in re.findall(r"-?[\d.]+(?:e[-+]?\d+)?|nan|inf", text)]

    a, b = numbers(saved), numbers(now)
    return len(a) == len(b) == 4 and a[:2] == b[:2] and all(
        math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in zip(a[2:], b[2:]))


def save_record(model: nn.Module) -> dict[str, str]:
    """What to record beside the kept state, so loading can check it lands on the same base."""
    frozen = bool(frozen_names(model))
    return {SCOPE_KEY: "trainable" if frozen else "all", FINGERPRINT_KEY: frozen_fingerprint(model) if frozen else ""}


def saved_record(path) -> dict[str, str]:
    """The record beside saved weights: model.safetensors' metadata, a checkpoint file's entries, or a sharded
    checkpoint directory's training-state file's."""
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        from trainwise.rundir.checkpoint_dirs import SHARDED_STATE_FILE

        path = path / SHARDED_STATE_FILE
        if not path.is_file():
            return {}
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    else:
        metadata = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {key: metadata[key] for key in (SCOPE_KEY, FINGERPRINT_KEY) if key in metadata}


class StateMismatch(RuntimeError):
    """Saved weights that do not fit the model (the message's first line says how)."""


def load_kept_state(model: nn.Module, state: dict[str, Any], record: dict[str, Any] | None = None) -> None:
    """Load a kept state: whole, or, for a frozen base, everything but the frozen parameters. Raises
    StateMismatch when names are missing that are not frozen, names are unknown, or the frozen base differs
    from the one the weights were saved with."""
    record = record or {}
    if record.get(SCOPE_KEY) != "trainable":
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise StateMismatch(str(e)) from None
        return
    result = model.load_state_dict(state, strict=False)
    missing = sorted(set(result.missing_keys) - frozen_names(model))
    if missing or result.unexpected_keys:
        raise StateMismatch(
            f"the saved weights do not fit the model: missing {missing[:3]}, unexpected "
            f"{sorted(result.unexpected_keys)[:3]} (the model's trainable part differs: another method, LoRA "
            "rank or target modules?)")
    check_same_base(model, record)


def check_same_base(model: nn.Module, record: dict[str, Any]) -> None:
    """Raise StateMismatch when `record` fingerprints another frozen base than `model`'s (a collective under
    FSDP: every rank calls it)."""
    saved = record.get(FINGERPRINT_KEY)
    if not saved:
        return
    now = frozen_fingerprint(model)
    if not same_base(saved, now):
        raise StateMismatch(
            f"the frozen base weights differ from those these weights were trained on ({now} "
            f"now, {saved} then). The model directory (model.hf) changed, or the base was initialised with "
            "another seed; rebuild it as it was.")
