"""The packaged GPU catalog and price list validate, carry sources, and user files extend or replace them;
malformed files are refused naming the line and the field."""
import pytest

from trainwise.errors import ConfigError
from trainwise.plan.catalog import find_gpus, load_gpus, load_prices, parse_rates

REQUIRED = ["T4", "L4", "A10", "A10G", "RTX 3090", "RTX 4080", "RTX 4090", "L40S", "V100 16GB", "V100 32GB",
            "A100 40GB", "A100 80GB", "H100 PCIe", "H100 SXM", "H200", "B200"]


def test_catalog_has_the_cards_users_rent_each_with_a_source():
    gpus = load_gpus()
    names = [g.name for g in gpus]
    assert len(gpus) >= 15
    assert set(REQUIRED) <= set(names)
    for gpu in gpus:
        assert gpu.source.strip()
        assert gpu.bf16 == (gpu.tflops.bf16 is not None), gpu.name
        assert gpu.tflops.fp32 < gpu.peak_tflops("bf16"), gpu.name  # tensor cores beat CUDA cores
    by_name = {g.name: g for g in gpus}
    assert by_name["H100 SXM"].peak_tflops("bf16") == pytest.approx(989, rel=0.01)  # dense, not sparse
    assert by_name["T4"].peak_tflops("bf16") == by_name["T4"].tflops.fp16  # no bf16: auto runs fp16
    assert by_name["A100 80GB"].memory_bytes > by_name["A100 40GB"].memory_bytes


def test_prices_are_dated_sourced_and_include_cny_clouds_beside_usd_ones():
    prices = load_prices(gpus=load_gpus())
    assert prices.as_of
    providers = {o.provider: o.currency for o in prices.offers}
    assert providers["Alibaba Cloud"] == "CNY" and providers["Tencent Cloud"] == "CNY"
    assert {"AWS", "Google Cloud", "Azure"} <= set(providers) and providers["AWS"] == "USD"
    assert all(o.source.startswith("http") for o in prices.offers)
    assert prices.exchange_rates_usd["USD"] == 1.0 and 0 < prices.exchange_rates_usd["CNY"] < 1
    assert any(o.month for o in prices.offers)


def test_user_prices_extend_replace_rows_and_can_drop_ours(tmp_path):
    extra = tmp_path / "prices.yaml"
    extra.write_text(
        "as_of: '2026-01'\n"
        "offers:\n"
        "  - {provider: AWS, region: us-east-1, instance: g5.xlarge, gpu: A10G, gpus: 1, currency: USD,\n"
        "     on_demand_hour: 0.5, source: 'my quote'}\n"
        "  - {provider: MyLab, region: basement, instance: box, gpu: RTX 4090, gpus: 2, currency: EUR,\n"
        "     on_demand_hour: 0.1, month: 50, source: 'our invoice'}\n"
        "exchange_rates_usd: {EUR: 1.1}\n")
    prices = load_prices(extra, load_gpus())
    g5 = [o for o in prices.offers if o.instance == "g5.xlarge"]
    assert len(g5) == 1 and g5[0].on_demand_hour == 0.5
    assert any(o.provider == "MyLab" for o in prices.offers) and prices.exchange_rates_usd["EUR"] == 1.1
    assert len(prices.offers) > 10
    extra.write_text(extra.read_text().replace("as_of:", "replace: true\nas_of:"))
    assert len(load_prices(extra).offers) == 2


def test_malformed_prices_file_names_line_and_field(tmp_path):
    bad = tmp_path / "prices.yaml"
    bad.write_text("offers:\n"
                   "  - {provider: A, region: r, instance: i, gpu: T4, currency: USD, on_demand_hour: 1, source: a-quote}\n"
                   "  - provider: B\n"
                   "    region: r\n"
                   "    instance: i2\n"
                   "    gpu: T4\n"
                   "    currency: USD\n"
                   "    on_demand_hour: -3\n"
                   "    source: somewhere\n")
    with pytest.raises(ConfigError, match=r"line 3 \(offers\[1\]\): on_demand_hour"):
        load_prices(bad)
    bad.write_text("offers: [{provider: A, region: r, instance: i, gpu: T5, currency: USD, source: abcd}]\n")
    with pytest.raises(ConfigError, match="unknown card 'T5'.*'T4'"):
        load_prices(bad, load_gpus())
    bad.write_text("offers: [oops\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_prices(bad)


def test_card_names_are_matched_loosely_and_unknown_ones_listed():
    gpus = load_gpus()
    assert find_gpus(gpus, ["a100-80gb", "rtx4090", "NVIDIA H100 SXM"])[0].name == "A100 80GB"
    with pytest.raises(ConfigError, match="unknown card.*Known cards: T4, L4"):
        find_gpus(gpus, ["GTX 1080"])


def test_exchange_rates_from_the_command_line():
    assert parse_rates(["cny=0.14"]) == {"CNY": 0.14}
    with pytest.raises(ConfigError, match="CODE=USD_VALUE"):
        parse_rates(["CNY:7.2"])


@pytest.mark.parametrize("typed, expected", [
    ("A100", ["A100 40GB", "A100 80GB"]), ("a100", ["A100 40GB", "A100 80GB"]),
    ("H100", ["H100 PCIe", "H100 SXM"]), ("h100-sxm5", ["H100 SXM"]), ("A10", ["A10"]),
    ("4090", ["RTX 4090"]), ("V100", ["V100 16GB", "V100 32GB"]), ("A100-80GB", ["A100 80GB"]),
    ("H100-80GB", ["H100 PCIe", "H100 SXM"]), ("L40S-48GB", ["L40S"]), ("H200 141GB", ["H200"]),
    ("RTX4090-24GB", ["RTX 4090"]),
])
def test_a_family_name_picks_every_card_it_starts_and_aliases_resolve(typed, expected):
    assert [g.name for g in find_gpus(load_gpus(), [typed])] == expected


def test_a_card_named_twice_is_planned_once():
    assert [g.name for g in find_gpus(load_gpus(), ["A100", "a100 80gb"])] == ["A100 40GB", "A100 80GB"]
