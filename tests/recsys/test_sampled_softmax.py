"""Sampled softmax for next-item models on large catalogues: the same loss as the full softmax when every
item is a negative, far less memory than it at a large catalogue, negatives that resume exactly, and a small
shop-sasrec run with `model.args.loss=sampled` that ranks better than popularity."""
import json

import pytest
import torch
from torch.nn import functional as F

from tests.conftest import invoke
from trainwise.recsys.models import GRU4Rec, SASRec
from trainwise.recsys.sampled import NegativeSampler, sampled_softmax_loss
from trainwise.recsys.sequences import IGNORE


def _batch(items: int, batch: int = 4, length: int = 6, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    history = torch.randint(1, items + 1, (batch, length), generator=generator)
    history[0, :3] = 0  # a left-padded row
    targets = torch.randint(0, items, (batch, length), generator=generator)
    targets[0, :3] = IGNORE
    return history, targets


@pytest.mark.parametrize("model_class", [SASRec, GRU4Rec])
def test_sampled_loss_with_every_item_as_negative_is_the_full_cross_entropy(model_class):
    items = 40
    args = (items, 6) if model_class is SASRec else (items,)
    model = model_class(*args, hidden=16, dropout=0.0, loss="sampled", num_sampled=items).train()
    history, targets = _batch(items)
    states = model(history)
    assert states.shape == (4, 6, 16)  # states, not [batch, items, positions] logits
    sampled = sampled_softmax_loss(states, targets, model.item_embedding.weight, torch.arange(items))
    full_logits = states @ model.item_embedding.weight[1:].T
    full = F.cross_entropy(full_logits.transpose(1, 2), targets, ignore_index=IGNORE)
    torch.testing.assert_close(sampled, full)
    # and its gradients: the same training signal
    sampled_grad = torch.autograd.grad(sampled, model.item_embedding.weight, retain_graph=True)[0]
    full_grad = torch.autograd.grad(full, model.item_embedding.weight)[0]
    torch.testing.assert_close(sampled_grad, full_grad)


def test_popularity_sampling_draws_popular_items_and_corrects_by_log_q():
    counts = [1000] + [0] * 99
    sampler = NegativeSampler(100, 5000, "popularity", counts)
    draws = sampler.draw(torch.device("cpu"))
    assert (draws == 0).float().mean() > 0.8  # item 0 holds ~91% of the (count + 1) mass
    torch.testing.assert_close(sampler.log_q.exp().sum(), torch.tensor(1.0))
    # the correction: with every item a candidate, subtracting log q from every logit equals the full softmax
    # of (logit - log q); so an item sampled 1000x more often needs a logit log(1001) higher to win as often
    states = torch.zeros(1, 1, 4)
    table = torch.zeros(101, 4)
    loss_popular = sampled_softmax_loss(states, torch.tensor([[0]]), table, torch.arange(100), sampler.log_q)
    loss_rare = sampled_softmax_loss(states, torch.tensor([[1]]), table, torch.arange(100), sampler.log_q)
    assert loss_popular > loss_rare  # equal scores: the popular item is the one a sampled loss under-rates


def test_accidental_hits_are_masked():
    states, table = torch.randn(1, 1, 8), torch.randn(11, 8)
    target = torch.tensor([[3]])
    with_hit = sampled_softmax_loss(states, target, table, torch.tensor([3, 5, 7]))
    without = sampled_softmax_loss(states, target, table, torch.tensor([5, 7]))
    torch.testing.assert_close(with_hit, without)


def test_bad_loss_options_are_refused():
    with pytest.raises(ValueError, match="loss=sampled"):
        SASRec(10, 5, loss="full", sparse_embeddings=True)
    with pytest.raises(ValueError, match="full .* or sampled"):
        SASRec(10, 5, loss="softmax")


SMALL = ["data.args.users=300", "data.args.items=200", "data.args.events=12000", "data.args.categories=5",
         "train.max_steps=120", "train.batch_size=64", "eval.every_steps=60", "train.log_every=30",
         "telemetry.enabled=false"]


def _ndcg(capsys, tmp_path, name, *extra):
    run = tmp_path / name
    trained = invoke(capsys, "train", "shop-sasrec", "--out", str(run), *SMALL, *extra)
    assert trained.returncode == 0, trained.stderr[-3000:]
    result = invoke(capsys, "eval", str(run), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)["ndcg@10"]


@pytest.mark.slow
def test_sampled_sasrec_trains_end_to_end_and_beats_popularity(tmp_path, capsys, one_thread):
    sampled = _ndcg(capsys, tmp_path, "sampled", "model.args.loss=sampled", "model.args.num_sampled=32",
                    "model.args.sampling=popularity")
    popular = _ndcg(capsys, tmp_path, "popularity", "model.name=popularity", "model.args={}")
    print(f"NDCG@10 sampled SASRec {sampled:.4f}, popularity {popular:.4f}")
    assert sampled > popular


@pytest.mark.parametrize("override, phrase", [
    ("model.args.loss=softmax", "model.args.loss: expected full (softmax over every item) or sampled"),
    ("model.args.num_sampled=0", "model.args.num_sampled: expected a positive int"),
    ("model.args.sampling=zipf", "model.args.sampling: expected uniform or popularity"),
])
def test_bad_loss_options_in_a_recipe_name_the_key_and_the_choices(override, phrase):
    from trainwise.errors import ConfigError
    from trainwise.recipes import load_recipe

    with pytest.raises(ConfigError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        load_recipe("shop-sasrec", [override])
