"""`trainwise plan` as a user runs it: a recipe in, the table or JSON out; bad input -> exit 2 with the fix."""
import json

import pytest

from tests.conftest import invoke


def plan_json(capsys, *args):
    result = invoke(capsys, "plan", "breast-cancer", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_plan_json_has_the_breakdown_every_card_and_this_machine(capsys):
    data = plan_json(capsys)
    breakdown = data["memory"]["cuda"]["breakdown_bytes"]
    assert set(breakdown) == {"parameters", "gradients", "optimizer_state", "activations", "temporaries"}
    assert data["memory"]["cpu"]["breakdown_bytes"]["parameters"] == data["job"]["parameter_bytes"]
    assert breakdown["parameters"] >= data["job"]["parameter_bytes"]  # CUDA rounds blocks up to 512 bytes
    assert data["memory"]["cuda"]["peak_bytes"] == sum(breakdown.values())
    cards = data["advice"]["cards"]
    assert len(cards) >= 17 and cards[-1]["kind"] == "cpu"
    assert all(card["fits"] for card in cards)  # a 4k-parameter MLP fits everywhere
    assert data["advice"]["cheapest"]["cost_on_demand"] > 0
    assert data["job"]["total_steps"] == 300 and data["prices"]["as_of"]
    assert "defaults to check" in data["prices"]["label"]


def test_plan_table_for_chosen_cards_in_yuan(capsys):
    result = invoke(capsys, "plan", "breast-cancer", "--gpu", "T4", "--gpu", "a10", "--currency", "CNY")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "T4" in out and "A10" in out and "H100" not in out
    assert "CNY" in out and "this machine" in out
    assert "Prices are defaults to check" in out


def test_currency_rate_set_by_the_user_changes_converted_costs(capsys):
    base = plan_json(capsys, "--gpu", "A10")
    cheap_yuan = plan_json(capsys, "--gpu", "A10", "--currency", "CNY", "--rate", "CNY=0.03")
    a10 = base["advice"]["cards"][0]
    assert a10["offer"]["provider"] == "Lambda"  # 0.75 USD/h beats 14 CNY/h at 0.139 USD per yuan
    assert a10["cost_on_demand"] == pytest.approx(a10["offer"]["hours"] * 0.75)
    # at 0.03 USD per yuan Tencent Cloud's 14 CNY/h is the cheaper A10, and costs are shown in yuan
    a10 = cheap_yuan["advice"]["cards"][0]
    assert cheap_yuan["advice"]["currency"] == "CNY" and a10["offer"]["provider"] == "Tencent Cloud"
    assert a10["cost_on_demand"] == pytest.approx(a10["offer"]["hours"] * 14.0)


def test_unknown_card_lists_the_catalog(capsys):
    result = invoke(capsys, "plan", "breast-cancer", "--gpu", "GTX 1080")
    assert result.returncode == 2
    assert "unknown card" in result.stderr and "H100 SXM" in result.stderr and "Traceback" not in result.stderr


def test_malformed_prices_file_names_the_line_and_field(capsys, tmp_path):
    prices = tmp_path / "mine.yaml"
    prices.write_text("offers:\n  - {provider: Me, region: x, instance: y, gpu: T4, gpus: zero,"
                      " currency: USD, source: invoice}\n")
    result = invoke(capsys, "plan", "breast-cancer", "--prices", str(prices))
    assert result.returncode == 2
    assert "mine.yaml, line 2" in result.stderr and "gpus" in result.stderr


def test_a_model_no_card_holds_even_with_fsdp_says_so(capsys):
    result = invoke(capsys, "plan", "breast-cancer", "model.args.hidden=[400000,400000]")
    assert result.returncode == 2
    assert "fits no card" in result.stderr and "FSDP" in result.stderr and "GiB" in result.stderr


@pytest.mark.slow
def test_probe_measures_this_machine_beside_the_estimate(capsys):
    data = plan_json(capsys, "--probe", "--gpu", "L4")
    probe = data["probe"]
    assert probe["device"] == "cpu" and probe["step_time_s"] > 0
    assert probe["peak_bytes"] == pytest.approx(probe["estimated_peak_bytes"], rel=0.05)
    cpu = data["advice"]["cards"][-1]
    assert cpu["measured"] and cpu["step_time_s"] == probe["step_time_s"]


def test_gpu_a100_plans_both_a100_cards_instead_of_suggesting_a10(capsys):
    data = plan_json(capsys, "--gpu", "A100")
    names = [card["name"] for card in data["advice"]["cards"] if card["kind"] != "cpu"]
    assert "A100 40GB" in names and "A100 80GB" in names and "A10" not in names


def test_plan_reads_at_80_columns_without_wrapped_cells_or_cut_names(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = invoke(capsys, "plan", "digits")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "…" not in result.stdout
    rows = [line for line in lines if line.startswith(" T4 ") or line.startswith(" A10 ")]
    assert len(rows) == 2 and all("yes" in row and "GiB" in row for row in rows)  # one line per card
    assert "A10: Lambda gpu_1x_a10;" in result.stdout  # the whole instance name, below the table


def test_plan_uses_the_full_table_when_the_terminal_is_wide(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = invoke(capsys, "plan", "digits")
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("card"))
    assert "micro × accum" in header and "cheapest offer" in header
    a10 = next(line for line in result.stdout.splitlines() if line.startswith(" A10 "))
    assert "Lambda gpu_1x_a10" in a10
