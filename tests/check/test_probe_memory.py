"""The one-batch probe trains the run's own model, so it must leave it exactly as it found it, and it must not copy
what cannot train (issue 35: a copy of every weight, to tell whether any moved, added the size of a frozen 135M
base, ~500 MiB, to a LoRA run's peak, for adapters of a few MB)."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import trainwise.check.sanity as sanity
from tests.conftest import tiny_config
from trainwise.check.overfit_one_batch import overfit_one_batch, probe_step
from trainwise.recipes.factories import build_data, build_model

COPIES = (torch.ops.aten.clone.default, torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)


class FrozenCopies(TorchDispatchMode):
    """Records every copy (clone, to(copy), copy_ from) whose source is the storage of a frozen parameter."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.frozen = {p.untyped_storage().data_ptr(): name for name, p in model.named_parameters()
                       if not p.requires_grad}
        self.copied: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in COPIES:
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            name = self.frozen.get(source.untyped_storage().data_ptr())
            if name is not None:
                self.copied.append(name)
        return func(*args, **(kwargs or {}))


def _half_frozen_run():
    """breast-cancer's MLP with its first layer frozen: a base under a trainable head, as LoRA leaves one."""
    config = tiny_config()
    bundle = build_data(config)
    torch.manual_seed(0)
    model = build_model(config, bundle.spec)
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    first.requires_grad_(False)
    return config, bundle, model


def test_the_check_gives_the_model_back_exactly_and_copies_no_frozen_weight(monkeypatch, one_thread):
    config, bundle, model = _half_frozen_run()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    steps, snapshots = [], []

    def probe(step, *args, **kwargs):
        steps.append(step)
        snapshots.append(set(kwargs["before"]))
        return probe_step(step, *args, **kwargs)

    monkeypatch.setattr(sanity, "probe_step", probe)
    with FrozenCopies(model) as watch:
        findings = sanity.sanity_check(config, bundle, model)
    probed = next(f for f in findings if f.code.startswith("overfit_probe"))
    assert probed.evidence["frozen_base"] and probed.evidence["largest_weight_change"] > 0  # it did train
    assert watch.frozen and watch.copied == []  # the frozen layer was read, never copied
    assert snapshots == [{name for name, p in model.named_parameters() if p.requires_grad}]
    after = model.state_dict()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)
    assert all(p.grad is None for p in model.parameters())
    assert len(steps) == 1 and not steps[0].optimizer.state  # the probe's Adam moments are freed, not kept


def test_the_probe_alone_copies_only_what_trains(one_thread):
    _, bundle, model = _half_frozen_run()
    inputs, targets = bundle.train.inputs[:32], bundle.train.targets[:32]
    trainable = [p for p in model.parameters() if p.requires_grad]
    with FrozenCopies(model) as watch:
        finding = overfit_one_batch(model, inputs, targets, optimizer=torch.optim.Adam(trainable, lr=3e-3),
                                    loss_fn=torch.nn.functional.cross_entropy, steps=10)
    assert finding.evidence["largest_weight_change"] > 0
    assert watch.copied == []
