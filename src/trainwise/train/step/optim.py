"""The optimizer a config names. Weight decay applies to weight matrices and kernels only: decaying biases
and normalisation gains hurts more than it regularises.

Fused kernels where this torch has them for the parameters' device: one kernel per step instead of one per
tensor, and, what matters more, they take a `found_inf` flag, so a step with non-finite gradients is
skipped on the device without the host looking (see train/step/train_step.py).

Embedding tables with sparse gradients (`nn.Embedding(sparse=True)`, a recommender's
`model.args.sparse_embeddings`) go to torch.optim.SparseAdam, the rest to the configured optimizer, as one
SplitOptimizer. SparseAdam updates only the rows a batch looked up, and keeps dense exp_avg/exp_avg_sq (the
same bytes as Adam). It applies no weight decay (decaying every row each step would undo the sparsity) and
has no fused kernel: it cannot take `found_inf`, so a split optimizer makes the train step read its skip
flag on the host once per step (one device sync, train/step/train_step.py) instead of skipping on the device.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwise.config import OptimConfig


def sparse_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Trainable embedding tables whose gradients are sparse."""
    return [m.weight for m in model.modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse and m.weight.requires_grad]


def parameter_groups(model: nn.Module, weight_decay: float, exclude: list[nn.Parameter] = ()) -> list[dict]:
    decay, no_decay = [], []
    excluded = {id(p) for p in exclude}
    for parameter in model.parameters():
        if parameter.requires_grad and id(parameter) not in excluded:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    sparse = sparse_parameters(model)
    dense = _dense_optimizer(parameter_groups(model, optim.weight_decay, exclude=sparse), optim)
    if not sparse:
        return dense
    return SplitOptimizer(dense, torch.optim.SparseAdam(sparse, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps))


def _dense_optimizer(groups: list[dict], optim: OptimConfig) -> torch.optim.Optimizer:
    if optim.name == "sgd":
        return _fused_where_supported(torch.optim.SGD, groups, lr=optim.lr, momentum=optim.momentum)
    cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
    return _fused_where_supported(cls, groups, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps)


class SplitOptimizer(torch.optim.Optimizer):
    """The dense optimizer and SparseAdam stepped as one: their parameter groups are this one's (the same
    dicts, so a learning-rate schedule reaches both), `state` shows both states, and the state dict keeps
    the two apart."""

    def __init__(self, dense: torch.optim.Optimizer, sparse: torch.optim.Optimizer):
        self.dense, self.sparse = dense, sparse
        super().__init__([p for g in (*dense.param_groups, *sparse.param_groups) for p in g["params"]], {})
        self._share_parts()

    def _share_parts(self) -> None:
        self.param_groups = [*self.dense.param_groups, *self.sparse.param_groups]

    @property  # type: ignore[override]
    def state(self) -> dict:
        """Both parts' states, read-only (what the planner counts)."""
        return {**self.dense.state, **self.sparse.state}

    @state.setter
    def state(self, _value) -> None:  # the base class's own empty state: the parts keep theirs
        pass

    _step_supports_amp_scaling = False  # SparseAdam takes no found_inf: the step decides on the host

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = self.dense.step(closure)
        self.sparse.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.dense.zero_grad(set_to_none)
        self.sparse.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"dense": self.dense.state_dict(), "sparse": self.sparse.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.dense.load_state_dict(state_dict["dense"])
        self.sparse.load_state_dict(state_dict["sparse"])
        self._share_parts()  # loading made the parts new group dicts: the schedule must reach those


def _fused_where_supported(cls: type[torch.optim.Optimizer], groups: list[dict], **options) -> torch.optim.Optimizer:
    try:
        return cls(groups, fused=True, **options)
    except (RuntimeError, TypeError):  # a device (or a torch) without the fused kernel: the default path
        return cls(groups, **options)
