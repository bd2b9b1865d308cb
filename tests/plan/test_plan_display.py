"""`trainwise plan`'s text says one precision for the cards asked about, shows costs below a cent as
numbers, and names no "cheapest" option that only rounding made cheapest (issue 26)."""
from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import invoke
from trainwise.cli.plan import _cheapest_shown
from trainwise.cli.plan_units import money_text
from trainwise.plan.job import job_from_config
from trainwise.recipes import load_recipe


def test_plan_for_a_t4_says_fp16_in_the_header_and_the_note(capsys):
    result = invoke(capsys, "plan", "breast-cancer", "--gpu", "T4")
    assert result.returncode == 0, result.stderr
    header, text = result.stdout.splitlines()[0], " ".join(result.stdout.split())
    assert "fp16" in header and "bf16" not in header
    assert "planned as fp16" in text and "planned as bf16" not in text
    assert "<0.01" not in text


def test_auto_precision_follows_the_cards_planned_for():
    config = load_recipe("breast-cancer", [])
    assert job_from_config(config, cards_without_bf16=("T4", "V100")).step.precision == "fp16"
    assert job_from_config(config).step.precision == "bf16"


def test_costs_below_a_cent_keep_two_significant_digits():
    assert money_text(0.000084) == "0.000084"
    assert money_text(0.0043) == "0.0043"
    assert money_text(0.25) == "0.25" and money_text(None) == "—" and money_text(0.0) == "0.00"


def _advice(*costs):
    rows = [SimpleNamespace(fits=True, cost_on_demand=cost, name=f"card{i}") for i, cost in enumerate(costs)]
    priced = [r for r in rows if r.cost_on_demand is not None]
    return SimpleNamespace(rows=rows, multi_gpu=[], cheapest=min(priced, key=lambda r: r.cost_on_demand))


def test_no_cheapest_when_only_rounding_tells_them_apart():
    assert _cheapest_shown(_advice(0.0000841, 0.0000843, None)) is None   # both shown as 0.000084
    assert _cheapest_shown(_advice(0.000078, None)) is None                # one priced option
    assert _cheapest_shown(_advice(0.000078, 0.00011)).name == "card0"
