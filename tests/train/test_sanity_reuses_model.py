"""The pre-training probe trains the run's own model for a few steps and gives its weights back (issue 35: it
loaded a second copy of the model, doubling a 10-step run's wall time on a real model)."""
from __future__ import annotations

import torch
from safetensors.torch import load_file

import trainwise.check.sanity as sanity
import trainwise.launch.runs as runs
import trainwise.recipes.factories as factories
from tests.conftest import tiny_config
from trainwise.check.overfit_one_batch import probe_step
from trainwise.launch.runs import train_run


def test_the_probe_builds_no_second_model_and_leaves_the_run_as_it_would_be(tmp_path, monkeypatch, one_thread):
    built = []
    original = factories.build_model

    def counting(config, spec):
        built.append(config.model.name)
        return original(config, spec)

    monkeypatch.setattr(factories, "build_model", counting)
    monkeypatch.setattr(runs, "build_model", counting)
    probed = []
    monkeypatch.setattr(sanity, "probe_step", lambda step, *args, **kwargs: probed.append(step.model)
                        or probe_step(step, *args, **kwargs))
    checked = train_run(tiny_config(train={"sanity": True, "max_steps": 10}), tmp_path / "checked")
    assert len(built) == 1 and len(probed) == 1  # the run's model; the probe trained it, then put its weights back
    unchecked = train_run(tiny_config(train={"sanity": False, "max_steps": 10}), tmp_path / "unchecked")
    a, b = load_file(checked.path / "model.safetensors"), load_file(unchecked.path / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)


def test_the_probe_copies_only_the_weights_that_train(monkeypatch):
    """A frozen base (LoRA, freeze) cannot move: the probe kept a copy of it anyway, ~500 MiB on the peak of a
    135M-parameter LoRA run (benchmarks/sft_real.py, issue 35)."""
    from trainwise.check.overfit_one_batch import overfit_one_batch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    frozen = model[0].weight
    frozen.requires_grad_(False)
    copied = []
    clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: copied.append(self.data_ptr())
                        or clone(self, *a, **k))
    finding = overfit_one_batch(model, torch.randn(16, 30), torch.randint(0, 2, (16,)),
                                optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                                            lr=1e-2),
                                loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out, y))
    assert copied and frozen.data_ptr() not in copied  # the trained weights were copied, the frozen one never
    assert finding.evidence["largest_weight_change"] > 0
