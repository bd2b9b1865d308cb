"""Chunked cross-entropy equals the plain one (value and gradients) and never holds all logits."""
from __future__ import annotations

import pytest
import torch

from trainwise.errors import ConfigError
from trainwise.llm import methods
from trainwise.data.batch import token_loss_sum
from trainwise.train.step.train_step import TokenLossModel

from .conftest import tiny_model


def lm_loss_sum(model, batch, chunk_size=None):
    inputs = {k: batch[k] for k in ("input_ids", "position_ids")}
    if chunk_size is None:
        return token_loss_sum(model(**inputs).logits, batch["labels"])
    return TokenLossModel(model, chunk_size)(labels=batch["labels"], **inputs)


def _batch(vocab=512, seed=0, length=24):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, length), generator=g)
    labels = torch.roll(ids, -1, dims=1)
    labels[:, -1] = -100
    labels[0, :5] = -100  # a masked prompt
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(length).expand(2, length)}


@pytest.mark.parametrize("family,method", [("llama", "full"), ("gpt2", "full"), ("qwen", "lora"),
                                           ("llama-untied", "freeze")])
def test_chunked_loss_equals_the_full_loss_and_its_gradients(family, method):
    batch = _batch()
    grads = []
    for chunk in (None, 7):
        model = methods.apply_method(tiny_model(family), method)
        loss = lm_loss_sum(model, batch, chunk_size=chunk)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    (plain, plain_grads), (chunked, chunked_grads) = grads
    torch.testing.assert_close(chunked, plain)
    for a, b in zip(plain_grads, chunked_grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_the_sum_ignores_masked_tokens():
    logits = torch.randn(1, 4, 10)
    labels = torch.tensor([[1, -100, 2, -100]])
    expected = torch.nn.functional.cross_entropy(logits[0, [0, 2]], labels[0, [0, 2]], reduction="sum")
    torch.testing.assert_close(token_loss_sum(logits, labels), expected)


def test_chunked_loss_never_holds_all_logits():
    from trainwise.plan.allocation_tracker import AllocationTracker
    batch = _batch(vocab=4096, length=64)
    model = tiny_model("llama", vocab_size=4096)
    peaks = {}
    for chunk in (None, 16):
        tracker = AllocationTracker()
        with tracker:
            lm_loss_sum(model, batch, chunk_size=chunk).backward()
        peaks[chunk] = tracker.peak["micro_batches"]
        model.zero_grad(set_to_none=True)
    all_logits = 2 * 64 * 4096 * 4
    assert peaks[None] - peaks[16] > 1.5 * all_logits  # the logits and their gradient, never whole


def test_a_bad_chunk_size_is_refused():
    with pytest.raises(ConfigError, match="positive"):
        lm_loss_sum(tiny_model("llama"), _batch(), chunk_size=0)


def test_the_fused_chunk_matches_autograd_with_a_soft_cap_and_a_bias():
    from trainwise.data.batch import chunked_token_loss_sum
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    labels = torch.tensor([[1, 2, -100, 4, 5], [6, -100, 8, 9, 10]])
    results = []
    for fused in (False, True):
        head.zero_grad(set_to_none=True)
        hidden.grad = None
        if fused:
            loss = chunked_token_loss_sum(hidden, head, labels, chunk_size=3, logit_softcap=5.0)
        else:
            loss = token_loss_sum(torch.tanh(head(hidden) / 5.0) * 5.0, labels)
        (2.0 * loss).backward()
        results.append([loss.detach(), hidden.grad, head.weight.grad, head.bias.grad])
    for plain, fused in zip(*results):
        torch.testing.assert_close(fused, plain)
