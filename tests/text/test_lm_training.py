"""A language model through the Trainer: token batches, tokens/s and MFU, streamed validation, no syncs."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_config
from tests.data.text.test_prepare_text import make_corpus
from trainwise.data.prepare import PrepareOptions
from trainwise.data.prepare import prepare_corpus as prepare
from trainwise.rundir import RunDir
from trainwise.data.text.bundle import text_bundle
from trainwise.text.gpt import GPT, GPTConfig
from trainwise.train.loop.host_syncs import HostSyncCounter
from trainwise.train.loop.progress import _describe
from trainwise.train.callbacks.token_rates import flops_per_token, token_figures
from trainwise.train.loop.trainer import Trainer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    prepare(make_corpus(root / "corpus", documents=24), root / "prepared", PrepareOptions(val_fraction=0.2))
    return root / "prepared"


def test_trainer_records_tokens_per_s_and_perplexity_without_syncs(corpus, tmp_path):
    bundle = text_bundle(corpus, seq_len=32)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=bundle.spec.num_classes, context=32, layers=1, heads=2, width=16))
    config = tiny_config(train={"max_steps": 12, "batch_size": 8, "micro_batch_size": 4, "log_every": 6,
                                "device": "cpu", "precision": "fp32"},
                         data={"num_workers": 0}, eval={"every_steps": 6}, checkpoint={"every_steps": None})
    counter = HostSyncCounter()
    trainer = Trainer(model, bundle.train, bundle.val, config=config, run_dir=RunDir.create(tmp_path / "run"),
                      callbacks=[counter.step_marker()], data_spec=bundle.spec)
    with counter:
        trainer.fit()
    between = {step: calls for step, calls in counter.by_step.items() if step and step not in (6, 12)}
    assert between == {}, f"host syncs between log steps: {between}"
    train = trainer.run_dir.read_metrics("train")
    assert train[-1]["tokens_per_s"] > 0 and "mfu" not in train[-1]  # no catalogue peak for a CPU
    assert train[-1]["flops_per_token"] == pytest.approx(flops_per_token(model, 32))
    val = trainer.run_dir.read_metrics("val")[-1]
    assert val["perplexity"] == pytest.approx(torch.tensor(val["loss"]).exp().item(), rel=1e-5)
    assert 0 <= val["token_accuracy"] <= 1 and val["loss"] < train[0]["loss"] + 1
    summary = trainer.run_dir.read_summary()  # a language model, said so (issue 35), with its typical tokens/s
    assert summary["task"]["kind"] == "language_model" and summary["task"]["headline"] == "loss"
    assert summary["task"]["detail"].startswith("language model, vocabulary of")
    assert summary["timings"]["tokens_per_s"] > 0


def test_mfu_and_the_progress_line():
    record = {"loss": 2.0, "lr": 1e-3, "samples_per_s": 10.0, "data_wait_fraction": 0.0,
              **token_figures(1000.0, 6e6, None)}
    assert _describe(record) == "loss 2.0000  lr 1.00e-03  1,000 tokens/s"  # no peak, no MFU: nothing to say
    with_peak = token_figures(1000.0, 6e6, 1.2e10)
    assert with_peak["mfu"] == pytest.approx(0.5)
    assert "1,000 tokens/s  MFU 50%" in _describe({**record, **with_peak})


def test_flops_per_token_counts_tied_weights_once_and_attention():
    model = GPT(GPTConfig(vocab_size=50, context=16, layers=2, heads=2, width=16))
    weights = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()  # tied head counted once
    assert flops_per_token(model, 16) == 6 * weights + 12 * 2 * 2 * 8 * 16


def test_a_frozen_weight_costs_four_flops_a_token_not_six():
    """Its backward carries the gradient on (2) but computes none for itself: an adapter run's MFU is not
    inflated by the base it does not train."""
    model = GPT(GPTConfig(vocab_size=50, context=16, layers=2, heads=2, width=16))
    weights = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    head = model.lm_head.weight.numel() + (model.lm_head.bias.numel() if model.lm_head.bias is not None else 0)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith("lm_head") or name.startswith("wte"))
    assert flops_per_token(model, 16) == 6 * head + 4 * (weights - head) + 12 * 2 * 2 * 8 * 16


def test_catalogue_peak_for_a_cuda_device_name():
    from trainwise.plan.planner import device_peak_flops

    assert device_peak_flops("NVIDIA H100 80GB HBM3", "bf16") > 5e14
    assert device_peak_flops("NVIDIA Imaginary 9000", "bf16") is None
