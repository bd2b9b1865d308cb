"""`trainwise train shop-sasrec model.name=popularity` as the README says it (issue 26): the recipe's SASRec
arguments are dropped, and the popularity baseline is counted, not trained for hundreds of steps."""
import json

import pytest
import torch

from tests.conftest import invoke
from trainwise.errors import ConfigError
from trainwise.recipes import load_recipe
from trainwise.recsys.models import Popularity

TINY = ["data.args.users=150", "data.args.items=100", "data.args.events=5000", "data.args.categories=5",
        "train.batch_size=32", "telemetry.enabled=false"]


def test_switching_the_model_drops_the_arguments_of_the_recipes_model():
    assert load_recipe("shop-sasrec", ["model.name=popularity"]).model.args == {}
    assert load_recipe("shop-sasrec", ["model.name=gru4rec"]).model.args == {"hidden": 64, "layers": 2,
                                                                             "dropout": 0.2}
    with pytest.raises(ConfigError, match="popularity takes no arguments"):  # one given on purpose is checked
        load_recipe("shop-sasrec", ["model.name=popularity", "model.args.hidden=8"])


def test_the_popularity_baseline_is_counted():
    model = Popularity(3, item_counts=[0, 9, 2])
    assert model.counted and torch.allclose(model.item_bias, torch.log1p(torch.tensor([0.0, 9.0, 2.0])))


def test_the_readme_command_trains_popularity_by_counting(tmp_path, capsys, one_thread):
    run = tmp_path / "run"
    result = invoke(capsys, "train", "shop-sasrec", "--out", str(run), "model.name=popularity", *TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 0
    assert summary["final"]["ndcg@10"] > summary["task"]["chance_metrics"]["ndcg@10"]
