"""Language-model layouts: step times bounded by physics, prices, and the hardware levers (pure: no tracing)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.plan.test_advise import SMALL, card, estimates
from trainwise.plan import advise_layouts, advise_levers
from trainwise.plan.advise import plan_card, Options
from trainwise.plan.catalog import load_gpus, load_prices
from trainwise.plan.llm_time import StepWork, floor_seconds, layout_price, step_seconds

GiB = 2**30
# one micro-batch of an 8B model at 2,048 tokens with a bf16 base (LoRA-like), as the trace reports it
EIGHT_B = StepWork(flops=1.0e14, bytes_written=60e9, ops=9_000, weight_reads=3 * 16e9, optimizer_bytes=2e9,
                   optimizer_ops=600, gathered_bytes=16e9, gradient_bytes=0.17e9, trainable_weights=42e6)
CATALOGUE = load_gpus()


@pytest.mark.parametrize("gpu", CATALOGUE, ids=lambda g: g.name)
def test_no_layout_is_faster_than_its_flops_at_the_cards_peak(gpu):
    for cards in (1, 2, 8, 64):
        for offload in (False, True):
            seconds = step_seconds(EIGHT_B, gpu, "bf16", 16, 1, cards, offload).seconds
            # the cards together cannot do the step's FLOPs faster than their peak
            assert seconds * cards >= floor_seconds(EIGHT_B, gpu, "bf16", 16, 1)


@pytest.mark.parametrize("gpu", CATALOGUE, ids=lambda g: g.name)
def test_cpu_offload_is_never_faster_than_no_offload(gpu):
    for cards in (1, 2, 4, 8, 16):
        plain = step_seconds(EIGHT_B, gpu, "bf16", 16, 1, cards).seconds
        assert step_seconds(EIGHT_B, gpu, "bf16", 16, 1, cards, offload=True).seconds > plain


@pytest.mark.parametrize("gpu", CATALOGUE, ids=lambda g: g.name)
def test_fsdp_over_n_cards_is_never_more_than_n_times_one_cards_throughput(gpu):
    one = step_seconds(EIGHT_B, gpu, "bf16", 64, 1).seconds
    for cards in (2, 4, 8, 16, 32, 64):
        assert cards * step_seconds(EIGHT_B, gpu, "bf16", 64, 1, cards).seconds >= one


def test_fsdp_over_pcie_pays_more_for_its_gathers_than_over_nvlink():
    pcie = card("P", 80, 1000).model_copy(update={"interconnect": "pcie", "link_gbs": 32})
    nvlink = card("N", 80, 1000).model_copy(update={"link_gbs": 450})
    slow, fast = (step_seconds(EIGHT_B, g, "bf16", 16, 1, 8) for g in (pcie, nvlink))
    assert slow.bound == "interconnect" and slow.seconds > fast.seconds


def test_a_card_without_bf16_is_timed_at_its_fp16_peak_and_named_so():
    t4 = next(g for g in CATALOGUE if g.name == "T4")
    job = SimpleNamespace(precision="bf16", precision_without_bf16="fp16", dtype="bf16")  # auto asked
    assert advise_layouts.card_precision(job, t4) == "fp16"
    assert advise_layouts.card_precision(job, next(g for g in CATALOGUE if g.name == "RTX 4090")) == "bf16"
    # the T4 QLoRA case: ~9.3e14 FLOPs a step can never take less than ~14 s at 65 TFLOP/s
    seconds = step_seconds(EIGHT_B, t4, "fp16", 9, 1).seconds
    assert seconds >= 9 * EIGHT_B.flops / 65e12


def test_a_layout_is_priced_per_hour_per_card_and_for_the_run():
    prices = load_prices()
    a100 = next(g for g in CATALOGUE if g.name == "A100 40GB")
    one = layout_price(a100, 1, prices, "USD", hours=10.0)
    assert one.per_hour == pytest.approx(1.29) and one.run == pytest.approx(12.9)  # Lambda's 1-GPU A100
    eight = layout_price(a100, 8, prices, "USD", hours=None)
    assert eight.per_hour == pytest.approx(21.96) and eight.per_card_hour == pytest.approx(21.96 / 8)
    assert eight.run is None and "p4d" in eight.offer  # FSDP needs its 8 cards in one machine
    sixteen = layout_price(a100, 16, prices, "CNY", hours=1.0)
    assert sixteen.per_hour == pytest.approx(2 * 21.96 / 0.139) and sixteen.offer.startswith("2 x ")


def test_more_cards_and_a_bigger_card_are_levers_when_the_job_fits_no_card_asked_about(monkeypatch):
    job = estimates(fixed=30 * GiB, optimizer_peak=30 * GiB, sharded_state_bytes=28 * GiB, per_sample=0.01 * GiB)
    for module in (advise_layouts, advise_levers):
        monkeypatch.setattr(module, "advice_estimates", lambda est: job)
    monkeypatch.setattr(advise_layouts, "work_at", lambda est, micro: EIGHT_B)
    mid, v100 = card("Mid", 40, 300), card("Old", 32, 125).model_copy(update={"bf16": False})
    est = SimpleNamespace(job=SimpleNamespace(batch_size=64, seq_len=2048, precision="bf16", dtype="bf16",
                                              method="lora"), curve=job.cuda_memory)
    fsdp, bigger = advise_levers.hardware_levers(est, SMALL, (card("Big", 80, 1000), SMALL, mid, v100))
    cards = int(fsdp.name.split()[2])  # "FSDP over N x Small"
    assert plan_card(job, SMALL, Options(), cards, "fsdp").fits
    assert not plan_card(job, SMALL, Options(), cards // 2, "fsdp" if cards > 2 else "single").fits
    assert fsdp.fits == ("Small",) and fsdp.peak_bytes < SMALL.memory_bytes  # per rank
    # the slowdown is the ratio of the step times the layouts print: FSDP's over one card's (as if it fitted)
    rows = {row.cards: row for row in advise_layouts.layouts(est, (SMALL,), 64)}
    assert fsdp.slowdown == pytest.approx(rows[cards].step_time_s / rows[1].step_time_s, abs=1e-3)
    # the smallest bigger card that holds it and has bf16 (a 32 GiB card without it is no home for bf16 weights)
    assert bigger.name.startswith("a bigger card (Mid") and bigger.how == "--gpu Mid"
    assert advise_levers.hardware_levers(est, card("Big", 80, 1000), (SMALL, mid)) == []  # it fits: none


def test_pasted_card_names_stay_one_argument():
    assert advise_levers.gpu_flag("H100 PCIe") == '--gpu "H100 PCIe"' and advise_levers.gpu_flag("T4") == "--gpu T4"


def test_fewer_cards_than_an_instance_holds_pay_for_the_instance():
    h100 = next(g for g in CATALOGUE if g.name == "H100 SXM")
    four = layout_price(h100, 4, load_prices(), "USD", hours=2.0)
    assert four.per_hour == pytest.approx(23.92) and four.per_card_hour == pytest.approx(23.92 / 8)
    assert four.run == pytest.approx(2 * 23.92)
