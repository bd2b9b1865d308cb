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


# ---- language models: the renting question (issue 34) ---------------------------------------------------------

pytest_llm = pytest.importorskip  # transformers/peft are optional: the language-model cases skip without them


def lm_plan(capsys, *args):
    pytest_llm("transformers")
    pytest_llm("peft")
    result = invoke(capsys, "plan", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_an_8b_lora_plans_a_bf16_base_that_fits_a_4090_and_full_adamw_does_not_fit_an_a100_40gb(capsys):
    lora = lm_plan(capsys, "llama-3.1-8b", "--method", "lora", "--seq-len", "2048", "--batch", "2", "--gpu",
                   "RTX4090", "--gpu", "A100-40GB", "--checkpointing")
    assert lora["job"]["dtype"] == "bf16"  # no --dtype: the frozen base is bf16, as practitioners run it
    layouts = {row["card"]: row for row in lora["layouts"] if row["cards"] == 1}
    needed = layouts["RTX 4090"]["needed_bytes"] / 2**30
    assert 12 <= needed <= 24 and layouts["RTX 4090"]["fits"]
    assert layouts["RTX 4090"]["price_per_hour"] > 0 and layouts["RTX 4090"]["tokens_per_s"] > 0
    _assert_no_layout_beats_its_flops_at_peak(lora)
    full = lm_plan(capsys, "llama-3.1-8b", "--method", "full", "--seq-len", "2048", "--batch", "2", "--gpu",
                   "A100-40GB", "--no-checkpointing", "--steps", "100")
    assert full["job"]["dtype"] == "fp32"  # fp32 master weights under bf16 autocast
    one = next(row for row in full["layouts"] if row["cards"] == 1)
    assert not one["fits"] and one["needed_bytes"] > one["usable_bytes"]
    fsdp = next(row for row in full["layouts"] if row["fits"])
    assert fsdp["run_cost"] == pytest.approx(fsdp["price_per_hour"] * fsdp["run_hours"])
    assert fsdp["run_hours"] == pytest.approx(100 * fsdp["step_time_s"] / 3600)
    _assert_no_layout_beats_its_flops_at_peak(full)


def _assert_no_layout_beats_its_flops_at_peak(report):
    from trainwise.plan.catalog import load_gpus
    cards = {gpu.name: gpu for gpu in load_gpus()}
    for row in report["layouts"]:
        peak = cards[row["card"]].peak_tflops(row["precision"]) * 1e12
        assert row["step_time_s"] * row["cards"] >= report["flops_per_step"] / peak, row


def test_list_models_stands_alone_with_column_headers(capsys):
    pytest_llm("transformers")
    result = invoke(capsys, "plan", "--list-models")
    assert result.returncode == 0, result.stderr
    header, first = result.stdout.splitlines()[:2]
    assert header.split()[:3] == ["name", "parameters", "family"] and first.startswith("gpt2")


def test_an_unknown_model_name_points_to_the_model_list(capsys):
    from tests.conftest import assert_refused
    assert_refused(invoke(capsys, "plan", "llama-9.9-zillion"), "unknown recipe", "--list-models")


def _config_json(tmp_path, **changes):
    fields = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 256}
    fields.update(changes)
    fields = {k: v for k, v in fields.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    return str(path)


@pytest.mark.parametrize("changes, phrase", [
    (dict(num_hidden_layers=None), "'num_hidden_layers' (the number of blocks)"),
    (dict(num_attention_heads=0), "'num_attention_heads' is 0"),
    (dict(num_hidden_layers="two"), "'num_hidden_layers' is 'two'"),
    (dict(num_attention_heads=5), "5 attention heads do not divide the width 64"),
    (dict(hidden_size=None), "'hidden_size' (the width)"),
])
def test_a_malformed_config_json_is_one_message_naming_the_field(tmp_path, capsys, changes, phrase):
    from tests.conftest import assert_refused
    pytest_llm("transformers")
    assert_refused(invoke(capsys, "plan", _config_json(tmp_path, **changes), "--method", "lora"), phrase)
