"""The recommenders train under bf16 autocast (what `precision: auto` picks on a recent GPU; the CPU runs the
same autocast path): every model, the sampled softmax included, takes the same early steps as in fp32 within
bf16's rounding, and the loss goes down. The tolerance is modelled on bf16's 8-bit mantissa (relative
rounding 2**-9 per operation), not read off this machine's kernels: 2% after 4 steps."""
import json

import pytest

from trainwise.recipes import load_recipe
from trainwise.launch.runs import train_run

TINY = ["data.args.users=300", "data.args.items=200", "data.args.events=8000", "data.args.categories=5",
        "data.args.max_eval_queries=100", "train.max_steps=12", "train.epochs=null", "eval.every_steps=12",
        "eval.every_epoch=false", "train.log_every=4", "telemetry.enabled=false", "train.sanity=false"]
MODELS = {"sasrec": ("shop-sasrec", []), "sasrec-sampled": ("shop-sasrec", ["model.args.loss=sampled",
                                                                              "model.args.num_sampled=50"]),
          "gru4rec": ("shop-sasrec", ["model.name=gru4rec", "model.args={}"]), "din": ("shop-din", [])}


def _losses(tmp_path, name, precision):
    recipe, overrides = MODELS[name]
    run = train_run(load_recipe(recipe, [*TINY, *overrides, f"train.precision={precision}"]),
                    tmp_path / f"{name}-{precision}")
    events = [json.loads(line) for line in (run.path / "events.jsonl").read_text().splitlines()]
    started = next(event for event in events if event["kind"] == "started")
    return [r["loss"] for r in run.read_metrics("train")], started["evidence"]["precision"]


@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_trains_like_fp32_within_its_rounding(tmp_path, name, one_thread):
    full, full_precision = _losses(tmp_path, name, "fp32")
    half, half_precision = _losses(tmp_path, name, "bf16")
    assert (full_precision, half_precision) == ("fp32", "bf16")
    assert abs(half[0] - full[0]) <= 0.02 * abs(full[0]), (half, full)
    assert half[-1] < half[0] and all(loss == loss for loss in half)  # learning, and no NaN
