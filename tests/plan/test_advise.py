"""Advice over hand-made catalogs and estimates: fit, micro-batch, ranking, multi-GPU, money."""
from dataclasses import replace

import pytest

from trainwise.plan.advise import (CUDA_CONTEXT_BYTES, Options, advise, cuda_fixed_bytes, largest_micro_batch,
                                   micro_batch_for, no_fit_message, plan_card)
from trainwise.plan.estimates import Estimates, PeakCurve
from trainwise.plan.timing import cpu_peak_flops, step_time
from trainwise.plan.catalog import Gpu, Offer, PriceList

GiB = 2**30
MACHINE = {"cpu_model": "test CPU", "cpu_cores": 8, "torch_threads": 8, "cpu_max_mhz": 3000.0,
           "cpu_flags": ("avx2", "fma"), "ram_bytes": 64 * GiB, "ram_available_bytes": 32 * GiB}


def card(name, memory_gib, bf16_tflops, bandwidth=1000.0, capability="8.0"):
    return Gpu(name=name, memory_gib=memory_gib, tflops={"fp32": bf16_tflops / 8, "tf32": bf16_tflops / 2,
                                                         "bf16": bf16_tflops, "fp16": bf16_tflops},
               bandwidth_gbs=bandwidth, tdp_w=300, compute_capability=capability, bf16=True,
               interconnect="nvlink", source="test")


def offer(gpu, hourly, gpus=1, currency="USD", month=None, spot=None, provider="Cloud"):
    return Offer(provider=provider, region="r", instance=f"{gpu}-{gpus}", gpu=gpu, gpus=gpus, currency=currency,
                 on_demand_hour=hourly, spot_hour=spot, month=month, source="test")


def line(fixed, per_sample, optimizer_peak, batch=64):
    """A memory curve through traces at 1 and the whole batch, for a step whose activations grow linearly."""
    return PeakCurve(points=((1, fixed + per_sample), (batch, fixed + per_sample * batch)),
                     optimizer_peak_bytes=optimizer_peak)


def estimates(fixed=2 * GiB, per_sample=0.1 * GiB, optimizer_peak=2.5 * GiB, **kw):
    values = dict(batch_size=64, micro_batch_size=64, total_steps=10_000, steps_per_epoch=100, precision="bf16",
                  cpu_precision="fp32", cuda_memory=line(fixed, per_sample, optimizer_peak),
                  cpu_memory=line(fixed, per_sample, optimizer_peak), sharded_state_bytes=1.6 * GiB,
                  largest_module_parameter_bytes=0.01 * GiB, flops_per_sample=3e12, bytes_per_sample=1e8,
                  ops_per_micro_batch=500, optimizer_bytes=1e9, optimizer_ops=100, checkpoint_bytes=GiB)
    values.update(kw)
    return Estimates(**values)


SMALL, BIG = card("Small", 8, 100), card("Big", 80, 1000, bandwidth=3000)
PRICES = PriceList(as_of="test", exchange_rates_usd={"USD": 1.0, "CNY": 0.125},
                   offers=(offer("Small", 0.5), offer("Big", 4.0), offer("Big", 16.0, currency="CNY", month=2000)))


def test_largest_micro_batch_is_what_the_budget_holds_after_the_fixed_part():
    est = estimates()
    assert largest_micro_batch(est, 2 * GiB + 10.5 * 0.1 * GiB) == 10
    assert largest_micro_batch(est, 2.4 * GiB) == 0  # the optimizer step alone needs 2.5 GiB
    assert largest_micro_batch(est, 100 * GiB) == 64  # never above the batch
    assert micro_batch_for(64, 10) == 8  # a divisor, so accumulation keeps the effective batch
    assert micro_batch_for(60, 7) == 6 and micro_batch_for(64, 0) == 0


def test_between_traced_sizes_the_curve_never_undershoots_a_convex_peak():
    # the peak moved: late in backward at small batches, at its start for large ones
    curve = PeakCurve(points=((1, 100.0), (8, 240.0), (64, 2000.0)), optimizer_peak_bytes=150.0)
    assert curve.peak(1) == 150.0  # the optimizer step is the floor
    assert curve.peak(8) == 240.0 and curve.peak(36) == 240.0 + (2000 - 240) * 28 / 56
    assert curve.per_sample_bytes == (2000 - 240) / 56
    assert curve.largest_micro_batch(1120.0, 64) == 36
    assert curve.largest_micro_batch(149.0, 64) == 0 and curve.largest_micro_batch(1e9, 64) == 64


def test_a_small_card_accumulates_what_a_big_card_runs_at_once():
    est = estimates()
    small, big = plan_card(est, SMALL, Options()), plan_card(est, BIG, Options())
    fixed = cuda_fixed_bytes(SMALL, False)
    assert fixed >= CUDA_CONTEXT_BYTES
    budget = 8 * GiB * 0.9 - fixed
    assert small.max_micro_batch == int((budget - 2 * GiB) // (0.1 * GiB))
    assert small.micro_batch_size * small.accumulation_steps == 64 and small.accumulation_steps > 1
    assert (big.micro_batch_size, big.accumulation_steps) == (64, 1)
    assert big.total_hours < small.total_hours
    assert small.headroom_bytes == small.memory_bytes - small.needed_bytes > 0


def test_step_time_is_compute_bound_for_big_matmuls_and_overhead_bound_for_tiny_models():
    big = estimates()
    seconds, bound = step_time(big, 64, 1, peak_flops=1e15, bandwidth=3e12, op_overhead_s=6e-6, utilisation=0.4)
    assert bound == "compute" and seconds == pytest.approx(3e12 * 64 / 4e14, rel=0.05)
    tiny = estimates(flops_per_sample=1e3, bytes_per_sample=1e2, optimizer_bytes=1e3)
    seconds, bound = step_time(tiny, 64, 1, peak_flops=1e15, bandwidth=3e12, op_overhead_s=6e-6, utilisation=0.4)
    assert bound == "overhead" and seconds == pytest.approx(600 * 6e-6, rel=0.01)


def test_cheapest_within_deadline_and_fastest_within_budget():
    est = estimates()
    small_hours = plan_card(est, SMALL, Options()).total_hours
    big_hours = plan_card(est, BIG, Options()).total_hours
    assert small_hours > 5 * big_hours
    prices = PriceList(as_of="t", exchange_rates_usd={"USD": 1.0}, offers=(offer("Small", 0.5), offer("Big", 8.0)))
    assert 0.5 * small_hours < 8.0 * big_hours
    relaxed = advise(est, (SMALL, BIG), prices, MACHINE, Options())
    assert relaxed.cheapest.name == "Small"  # 0.5/h × its hours is less than the Big card's bill
    assert relaxed.fastest.name == "Big"
    tight = advise(est, (SMALL, BIG), prices, MACHINE, Options(deadline_hours=(small_hours + big_hours) / 2))
    assert tight.cheapest.name == "Big"
    poor = advise(est, (SMALL, BIG), prices, MACHINE, Options(budget=small_hours * 0.5 * 1.01))
    assert poor.fastest.name == "Small"
    broke = advise(est, (SMALL, BIG), prices, MACHINE, Options(budget=0.001))
    assert broke.fastest is None and any("budget" in m for m in broke.messages)


def test_every_card_and_this_machine_are_rows():
    advice = advise(estimates(), (SMALL, BIG), PRICES, MACHINE, Options())
    assert [r.name for r in advice.rows][:2] == ["Small", "Big"]
    cpu = advice.rows[-1]
    assert cpu.kind == "cpu" and "test CPU" in cpu.name and cpu.cost_on_demand is None
    measured = advise(estimates(), (SMALL, BIG), PRICES, MACHINE, Options(), {"step_time_s": 2.0, "peak_bytes": 5})
    assert measured.rows[-1].measured and measured.rows[-1].total_hours == pytest.approx(2.0 * 10_000 / 3600)


def test_currency_conversion_and_monthly_break_even():
    est = estimates()
    usd = advise(est, (BIG,), PRICES, MACHINE, Options())
    big_hours = plan_card(est, BIG, Options()).total_hours
    row = usd.rows[0]
    # 16 CNY/h at 0.125 USD per yuan = 2 USD/h: cheaper than the 4 USD/h offer
    assert row.offer["currency"] == "CNY" and row.cost_on_demand == pytest.approx(2.0 * big_hours)
    assert row.break_even_hours_per_month == pytest.approx(2000 / 16)
    cny = advise(est, (BIG,), PRICES, MACHINE, Options(currency="CNY"))
    assert cny.rows[0].cost_on_demand == pytest.approx(16.0 * big_hours)
    assert any("monthly beats hourly" in m for m in usd.messages)


def test_multi_gpu_when_nothing_fits_one_card_fsdp_shards_the_state():
    huge = estimates(fixed=100 * GiB, optimizer_peak=100 * GiB, sharded_state_bytes=96 * GiB,
                     per_sample=0.05 * GiB)
    offers = PriceList(as_of="t", exchange_rates_usd={"USD": 1.0}, offers=(offer("Big", 30.0, gpus=8),))
    advice = advise(huge, (BIG,), offers, MACHINE, Options())
    assert not advice.rows[0].fits
    (option,) = advice.multi_gpu
    assert option.strategy == "fsdp" and option.cards == 2  # DDP replicates, so only sharding helps
    assert option.fits and option.cost_on_demand is not None
    assert advice.fits_anywhere


def test_nothing_fits_even_on_eight_cards_says_so_with_the_numbers():
    impossible = estimates(fixed=2000 * GiB, optimizer_peak=2000 * GiB, sharded_state_bytes=1000 * GiB,
                           largest_module_parameter_bytes=500 * GiB)
    advice = advise(impossible, (SMALL, BIG), PRICES, MACHINE, Options())
    assert not advice.fits_anywhere
    message = no_fit_message(impossible, (SMALL, BIG), Options())
    assert "8 × Big with FSDP" in message and "1000.0 GiB before sharding" in message


def test_cuda_fixed_costs_depend_on_the_card_generation_and_on_convolutions():
    from trainwise.plan.advise import CUBLAS_WORKSPACE_BYTES, CUDNN_WORKSPACE_BYTES

    ampere, hopper = card("A", 80, 300, capability="8.0"), card("H", 80, 900, capability="9.0")
    assert cuda_fixed_bytes(hopper, False) - cuda_fixed_bytes(ampere, False) == (
        CUBLAS_WORKSPACE_BYTES["hopper"] - CUBLAS_WORKSPACE_BYTES["pre_hopper"])
    assert cuda_fixed_bytes(ampere, True) - cuda_fixed_bytes(ampere, False) == CUDNN_WORKSPACE_BYTES
    # the fixed costs come off every card before the first sample
    est = estimates()
    assert plan_card(est, ampere, Options()).needed_bytes == int(est.peak(64) + cuda_fixed_bytes(ampere, False))


def test_cublas_workspace_follows_the_torch_source_per_card_generation():
    from trainwise.plan.advise import ALLOCATOR_SLACK_BYTES, cuda_allocator_fixed_bytes

    # CublasHandlePool.cpp: ":4096:2:16:8" before Hopper; 32 MiB on 9.x, 10.x and 12.x; cuBLASLt shares it
    for capability, workspace in (("7.5", 8.125), ("8.9", 8.125), ("9.0", 32), ("10.0", 32), ("12.0", 32)):
        gpu = card("X", 80, 100, capability=capability)
        assert cuda_allocator_fixed_bytes(gpu, False) == workspace * 2**20 + ALLOCATOR_SLACK_BYTES


def test_the_cuda_context_is_reported_apart_from_what_the_allocator_holds():
    est = estimates()
    row = plan_card(est, BIG, Options())
    assert row.cuda_context_bytes == CUDA_CONTEXT_BYTES
    assert row.needed_bytes == row.allocator_bytes + row.cuda_context_bytes
    # the allocator's side: the traced peak at the chosen micro-batch plus workspaces and segment slack
    assert row.allocator_bytes - est.peak(row.micro_batch_size) == pytest.approx(
        cuda_fixed_bytes(BIG, False) - CUDA_CONTEXT_BYTES, abs=1)
    assert "cuda_context_bytes" in row.to_dict() and "allocator_bytes" in row.to_dict()


def test_probe_calibration_scales_gpu_times():
    est = estimates()
    plain, calibrated = plan_card(est, BIG, Options()), plan_card(est, BIG, Options(calibration=1.5))
    assert calibrated.step_time_s == pytest.approx(1.5 * plain.step_time_s)


def test_cpu_peak_flops_from_vector_units():
    assert cpu_peak_flops(8, 3000, ("avx2", "fma"), "fp32") == 8 * 3e9 * 32
    assert cpu_peak_flops(8, 3000, ("avx512f",), "fp32") == 2 * cpu_peak_flops(8, 3000, ("avx2",), "fp32")
    assert cpu_peak_flops(8, 3000, ("avx2",), "bf16") < cpu_peak_flops(8, 3000, ("avx2",), "fp32")


def test_a_deadline_no_single_card_meets_brings_in_ddp_on_more_cards():
    est = estimates()
    one_card = plan_card(est, BIG, Options()).total_hours
    prices = PriceList(as_of="t", exchange_rates_usd={"USD": 1.0},
                       offers=(offer("Big", 4.0), offer("Big", 16.0, gpus=4)))
    relaxed = advise(est, (BIG,), prices, MACHINE, Options())
    assert relaxed.cheapest.offer["gpus"] == 1 and not relaxed.multi_gpu  # one card is cheaper per job
    advice = advise(est, (BIG,), prices, MACHINE, Options(deadline_hours=one_card / 3))
    (option,) = advice.multi_gpu
    assert option.strategy == "ddp" and option.cards == 4  # 2 cards at 90% efficiency are not 3× faster
    assert option.total_hours <= one_card / 3
    assert advice.cheapest is option and option.offer["gpus"] == 4


def test_host_ram_holds_the_final_save_of_the_weights():
    small = advise(estimates(), (SMALL, BIG), PRICES, MACHINE, Options())
    seven_b = advise(estimates(weight_bytes=int(13.5 * GiB)), (SMALL, BIG), PRICES, MACHINE, Options())
    assert seven_b.host_ram_bytes - small.host_ram_bytes >= 2 * 13.5 * GiB - GiB


def test_the_no_fit_message_never_offers_a_precision_already_in_use():
    impossible = estimates(fixed=500 * GiB, optimizer_peak=500 * GiB, sharded_state_bytes=400 * GiB)
    assert "precision=bf16" not in no_fit_message(impossible, (SMALL, BIG), Options())
    assert "precision=bf16" in no_fit_message(replace(impossible, precision="fp32"), (SMALL, BIG), Options())


def test_fsdp_beyond_one_server_is_started_on_several_machines():
    from trainwise.plan.advise_levers import fsdp_command

    assert fsdp_command(8) == "trainwise train --nproc 8 ... train.strategy=fsdp"
    assert "--nproc 8 --nnodes 2 --node-rank I --rdzv-endpoint HOST:PORT" in fsdp_command(16)
