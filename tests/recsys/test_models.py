"""The recommenders' structural promises: DIN ignores padding and scores the catalogue exactly as it scores
one pair; SASRec and GRU4Rec are causal; next-item models give the shapes the trainer's loss takes."""
import pytest
import torch

from trainwise.recsys.models import DIN, GRU4Rec, Popularity, SASRec

ITEMS, LENGTH = 40, 12


def _history(batch=5, pad=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    history = torch.randint(1, ITEMS + 1, (batch, LENGTH), generator=generator)
    history[:, :pad] = 0  # left padding
    return history


@pytest.mark.parametrize("attention", [True, False])
def test_din_ignores_padding(attention):
    torch.manual_seed(0)
    model = DIN(ITEMS, hidden=8, attention_hidden=6, mlp=(10,), attention=attention).eval()
    history, candidate = _history(), torch.randint(1, ITEMS + 1, (5, 1))
    before = model(torch.cat([history, candidate], 1))
    with torch.no_grad():
        model.item_embedding.weight[0] = torch.randn(8) * 10  # whatever the padding row holds
    assert torch.allclose(model(torch.cat([history, candidate], 1)), before, atol=1e-5)
    more_padding = torch.cat([torch.zeros(5, 7, dtype=torch.long), history], 1)  # a longer max_len
    assert torch.allclose(model(torch.cat([more_padding, candidate], 1)), before, atol=1e-5)
    if attention:
        assert torch.all(model.attention_weights(history, candidate[:, 0])[:, :4] == 0)


@pytest.mark.parametrize("attention", [True, False])
def test_din_scores_the_catalogue_as_it_scores_one_pair(attention):
    torch.manual_seed(1)
    model = DIN(ITEMS, hidden=8, attention_hidden=6, mlp=(10,), attention=attention).eval()
    history = _history()
    items = torch.arange(ITEMS)
    full = model.score_items(history, items)
    for item in (0, 17, ITEMS - 1):
        pair = model(torch.cat([history, torch.full((5, 1), item + 1)], 1))[:, 1]
        assert torch.allclose(full[:, item], pair, atol=1e-5)
    assert model(torch.cat([history, torch.ones(5, 1, dtype=torch.long)], 1))[:, 0].eq(0).all()


@pytest.mark.parametrize("model", [SASRec(ITEMS, LENGTH, hidden=16, layers=2, heads=2, dropout=0.0),
                                   GRU4Rec(ITEMS, hidden=16, dropout=0.0)], ids=["sasrec", "gru4rec"])
def test_next_item_models_are_causal(model):
    model.eval()
    history = _history(pad=3)
    states = model.encode(history)
    for t in (3, 6, LENGTH - 2):
        changed = history.clone()
        changed[:, t + 1:] = torch.randint(1, ITEMS + 1, changed[:, t + 1:].shape)
        after = model.encode(changed)
        assert torch.allclose(after[:, :t + 1], states[:, :t + 1], atol=1e-5), t
        assert not torch.allclose(after[:, t + 1:], states[:, t + 1:])


@pytest.mark.parametrize("model", [SASRec(ITEMS, LENGTH, hidden=16, dropout=0.1), GRU4Rec(ITEMS, hidden=16),
                                   Popularity(ITEMS)], ids=["sasrec", "gru4rec", "popularity"])
def test_next_item_outputs_fit_cross_entropy_in_training_and_rank_in_eval(model):
    history = _history()
    targets = torch.where(history > 0, torch.randint(0, ITEMS, history.shape), -100)
    model.train()
    loss = torch.nn.functional.cross_entropy(model(history), targets)
    loss.backward()
    assert torch.isfinite(loss) and model(history).shape == (5, ITEMS, LENGTH)
    model.eval()
    assert model(history).shape == (5, ITEMS)
    assert torch.allclose(model.score_items(history, torch.arange(ITEMS)), model(history), atol=1e-5)


def test_sasrec_padding_gives_no_nan_gradients():
    model = SASRec(ITEMS, LENGTH, hidden=16, dropout=0.0).train()
    history = _history(pad=LENGTH - 1)  # almost all padding: every padded query attends only to itself
    targets = torch.where(history > 0, 3, -100)
    torch.nn.functional.cross_entropy(model(history), targets).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
