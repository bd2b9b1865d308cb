"""Where autograd adds two gradients of one tensor in place, although the traced (fake) step adds them out of place.

When a tensor feeds several ops (a tied embedding read by the input lookup and the output head, a residual
stream, x used twice in an RMSNorm), backward sums its gradients in the node's input buffer. The engine
(torch/csrc/autograd/input_buffer.cpp, `accumulate`) adds the new gradient *into* the one already there
when that one is a plain dense tensor nobody else holds, not a view of another (`can_accumulate_inplace`)
and the new one is no tensor subclass; every fake tensor is one, so the trace sees `old + new`: one more
gradient-sized buffer than the real step. For a tied 8192 x 256 embedding whose head gradient arrives
first as a fresh fp32 copy (bf16 autocast), that is 8 MiB at the end of backward, where a small model's peak
falls; in fp32 the head's gradient arrives as the transpose of a matrix product (a view), and the engine
adds out of place, as the trace does.

The engine does that sum after a node's apply has returned (the node is still "current", its post-hooks have
run). `GradientBuffers` hooks every node of the graph the first time backward reaches it, so an
`aten.add.Tensor` seen while the current node has finished is such a sum; the tracker then counts the result
in the place of the old gradient instead of beside it. A gradient a node passes on twice (AddBackward hands
the same tensor to both inputs) is held twice and so, as for real, summed out of place.
"""
from __future__ import annotations

import torch

_ADD = torch.ops.aten.add.Tensor


class GradientBuffers:
    """The autograd nodes of the backward being traced, and which of them have finished their apply."""

    def __init__(self) -> None:
        self._graph_task = -1
        self._nodes: dict[int, object] = {}  # id -> node (held until this backward ends: ids stay unique)
        self._finished: set[int] = set()
        self._shared: set[int] = set()  # ids of gradients handed to two inputs at once

    def reused_operand(self, func, args, kwargs, out) -> torch.Tensor | None:
        """The operand whose memory the real engine reuses for `out` (an in-place input-buffer sum), or None."""
        task = torch._C._current_graph_task_id()
        if task == -1:
            return None
        if task != self._graph_task:  # a new backward: its nodes are new
            self._graph_task, self._nodes, self._finished, self._shared = task, {}, set(), set()
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        if self._nodes.get(id(node)) is not node:
            self._hook_from(node)  # reached mid-apply: its own ops are no input-buffer sums
            return None
        if func is not _ADD or id(node) not in self._finished or kwargs.get("alpha", 1) != 1:
            return None
        old, new = args[0], args[1]  # the engine reuses only the gradient already in the buffer
        if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor) or old is new:
            return None
        return old if id(old) not in self._shared and _reusable(old, out) else None

    def _hook_from(self, root) -> None:
        """Post-hooks on `root` and every node below it not hooked yet (AccumulateGrad excepted: a hook there
        makes the engine keep a second reference to the gradient, which it then copies instead of stealing)."""
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or self._nodes.get(id(node)) is node:
                continue
            self._nodes[id(node)] = node
            if type(node).__name__ != "AccumulateGrad":
                node.register_hook(self._finished_hook(id(node)))
            stack.extend(next_node for next_node, _ in node.next_functions)

    def _finished_hook(self, key: int):
        def finished(grad_inputs, _grad_outputs):
            self._finished.add(key)
            seen: set[int] = set()
            for grad in grad_inputs:
                if isinstance(grad, torch.Tensor):
                    (self._shared if id(grad) in seen else seen).add(id(grad))
        return finished


def _reusable(operand: torch.Tensor, out: torch.Tensor) -> bool:
    """A dense tensor of the result's shape and dtype owning its whole storage (not a view of another); a
    channels-last gradient is left out-of-place (an overestimate where the engine would reuse it)."""
    return (not operand._is_view() and operand.shape == out.shape and operand.dtype == out.dtype and operand.device == out.device
            and operand.is_contiguous()
            and operand.untyped_storage().nbytes() == operand.numel() * operand.element_size())
