"""`trainwise plan` on the recommender recipes: the planner traces the real step (a target per position for
SASRec, a click per candidate for DIN) and counts the item embedding tables and their optimizer state."""
import json

from tests.conftest import invoke
from trainwise.plan.job import estimate_job, job_from_config
from trainwise.recipes import load_recipe

SMALL = ["data.args.users=120", "data.args.items=300", "data.args.events=3000", "data.args.categories=5",
         "train.batch_size=16"]


def _sasrec_parameters(items: int, hidden: int, max_len: int, layers: int) -> int:
    """SASRec counted by hand: item table (+ padding row), positions, per block two LayerNorms, qkv, output
    projection and a two-layer feed-forward; a final LayerNorm."""
    block = 2 * 2 * hidden + (hidden * 3 * hidden + 3 * hidden) + (hidden * hidden + hidden) \
        + 2 * (hidden * hidden + hidden)
    return (items + 1) * hidden + max_len * hidden + layers * block + 2 * hidden


def test_plan_traces_sasrec_and_counts_the_item_table_and_its_adam_state():
    config = load_recipe("shop-sasrec", SMALL)
    estimate = estimate_job(job_from_config(config), device_kinds=("cpu",))
    expected = _sasrec_parameters(300, 64, 50, 2)
    assert estimate.parameter_count == expected
    assert estimate.parameter_bytes == 4 * expected
    item_table = 301 * 64 * 4
    assert estimate.parameter_bytes > item_table
    # AdamW keeps two fp32 moments per parameter (plus a scalar step count per tensor)
    assert 2 * 4 * expected <= estimate.optimizer_state_bytes <= 2 * 4 * expected + 64 * 8
    trace = estimate.memory["cpu"].trace_at(16)
    assert trace.breakdown["parameters"] >= 4 * expected


def test_plan_cli_on_both_recipes(capsys):
    for recipe in ("shop-sasrec", "shop-din"):
        result = invoke(capsys, "plan", recipe, *SMALL, "--json")
        assert result.returncode == 0, result.stderr[-3000:]
        job = json.loads(result.stdout)["job"]
        table = 301 * (64 if recipe == "shop-sasrec" else 32) * 4  # the item embedding, fp32
        assert job["parameter_bytes"] > table and job["optimizer_state_bytes"] >= 2 * job["parameter_bytes"]
