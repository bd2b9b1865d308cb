"""Language-model plans: traced on fake tensors from a meta build, extended over depth, equal to real peaks."""
from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.conftest import assert_refused, invoke  # noqa: E402
from trainwise.llm import methods  # noqa: E402
from trainwise.plan.advise_levers import candidate_levers  # noqa: E402
from trainwise.plan.llm_estimate import estimate_lm, trace_lm, traced_depths  # noqa: E402
from trainwise.plan.llm_job import LmJob  # noqa: E402
from trainwise.plan.llm_step import lm_step  # noqa: E402
from trainwise.plan.memory import trace_step  # noqa: E402
from trainwise.plan.traced_step import TrainingStep  # noqa: E402
from trainwise.plan.kernel_bounds import threads  # noqa: E402
from trainwise.plan.probe import measured_peak_bytes  # noqa: E402

TINY = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512)  # ~0.2M parameters


# what LmJob needs beyond the fields a test sets (it has no defaults: a RunConfig's come from the schema)
JOB_FIELDS = dict(micro_batch_size=None, method="full", trainable_blocks=2, lora=methods.LoraSettings(),
                  dtype="fp32", precision="bf16", optimizer="adamw", gradient_checkpointing=False,
                  loss_chunk_size=None, grad_clip_norm=1.0)


def job(**changes) -> LmJob:
    base = dict(model="llama-3.1-8b", seq_len=32, batch_size=2, overrides=TINY, dtype="fp32", precision="fp32",
                trainable_blocks=1)
    return LmJob(**{**JOB_FIELDS, **base, **changes})


@pytest.mark.parametrize("changes", [dict(method="full", gradient_checkpointing=True), dict(method="lora"),
                                     dict(method="freeze", gradient_checkpointing=True),
                                     dict(method="qlora", dtype="bf16", precision="bf16"),
                                     dict(method="full", dtype="bf16", precision="bf16", loss_chunk_size=16)])
def test_two_traced_depths_extend_exactly_to_the_full_depth(changes):
    planned = job(**changes)
    assert traced_depths(planned) is not None
    whole = trace_step(lm_step(planned, None, 2))
    extended = trace_lm(planned, 2)
    assert extended.peak_bytes == whole.peak_bytes
    assert extended.breakdown == whole.breakdown
    assert extended.micro_batch_flops == whole.micro_batch_flops


@pytest.mark.slow
@pytest.mark.parametrize("changes", [dict(method="lora", gradient_checkpointing=True),
                                     dict(method="full", dtype="bf16", precision="bf16", loss_chunk_size=16)])
def test_the_plan_is_the_cpu_allocators_peak_of_the_real_step(changes):
    planned = job(**changes)
    traced = trace_lm(planned, 2, device_kind="cpu")
    with threads(1):  # a process held to one thread (OMP_NUM_THREADS=1) measures with the threads the plan bounds
        real = measured_peak_bytes(lm_step(planned, None, 2, device_kind="cpu"), torch.device("cpu"))
    assert traced.peak_bytes == pytest.approx(real, rel=0.01)


def test_checkpointing_and_the_chunked_loss_plan_smaller():
    plain = trace_lm(job(method="full", seq_len=64), 2)
    checkpointed = trace_lm(job(method="full", seq_len=64, gradient_checkpointing=True), 2)
    chunked = trace_lm(job(method="full", seq_len=64, loss_chunk_size=16), 2)
    assert checkpointed.micro_batch_peak_bytes < plain.micro_batch_peak_bytes
    assert checkpointed.micro_batch_flops > plain.micro_batch_flops  # the recomputation is traced
    assert chunked.micro_batch_peak_bytes < plain.micro_batch_peak_bytes


def test_methods_are_traced_with_their_own_state():
    full, lora, qlora = (trace_lm(job(method=m, dtype="bf16", precision="bf16"), 2) for m in ("full", "lora", "qlora"))
    eight_bit = trace_lm(job(method="full", dtype="bf16", precision="bf16", optimizer="adamw8bit"), 2)
    weights = full.parameter_bytes
    assert full.optimizer_state_bytes == pytest.approx(2 * weights, rel=1e-3)  # two bf16 moments (+ step counts)
    assert eight_bit.optimizer_state_bytes < 0.75 * full.optimizer_state_bytes
    assert lora.optimizer_state_bytes == pytest.approx(8 * lora.parameter_count, rel=1e-2)  # fp32 adapters only
    assert qlora.breakdown["parameters"] < lora.breakdown["parameters"]  # the 4-bit base


def test_a_factory_that_casts_and_wraps_with_peft_plans():
    from trainwise.llm import hf

    def factory():  # what users write: build, cast, wrap
        model = hf.build_model(hf.resolve_config("gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=512,
                                                 n_positions=64), device=None).to(torch.bfloat16)
        return methods.apply_method(model, "lora")

    step = TrainingStep(build_model=factory, input_shape=(16,), input_dtype=torch.int64, num_classes=512,
                        vocabulary_size=512, target_shape=(16,), micro_batch_size=2, token_batches=True)
    trace = trace_step(step)  # built inside the fake mode it fails (Couldn't swap), so it is built on meta
    assert trace.parameter_count == methods.parameter_counts(factory()).trainable


def test_tied_weights_are_counted_once():
    planned = LmJob(**JOB_FIELDS, model="gpt2", seq_len=16, batch_size=1, overrides=dict(n_layer=2, n_embd=64, n_head=4,
                                                                      vocab_size=512, n_positions=64))
    est = estimate_lm(planned)
    assert est.facts.total_parameters == est.facts.trainable_parameters
    model = lm_step(planned, None, 1).build_model()
    assert est.trace_at(1).parameter_bytes == sum(p.numel() * 4 for p in set(model.parameters()))


def test_costs_per_token_and_per_sequence_are_forward_backward_slopes():
    est = estimate_lm(job(method="full", seq_len=8, batch_size=4, micro_batch_size=2))
    small, large = est.trace_at(1), est.trace_at(4)
    slope = (large.micro_batch_peak_bytes - small.micro_batch_peak_bytes) / 3
    assert est.per_sequence_bytes == pytest.approx(slope) and slope > 0  # never the overall peak's difference
    longer = est.longer.micro_batch_peak_bytes - est.trace_at(2).micro_batch_peak_bytes
    assert est.per_token_bytes == pytest.approx(longer / 8) and longer > 0


def test_a_lever_in_use_is_never_offered():
    names = {name for name, *_ in candidate_levers(job(method="lora", gradient_checkpointing=True,
                                                       loss_chunk_size=64, dtype="bf16"))}
    assert not any(n.startswith(("gradient checkpointing", "chunked", "LoRA", "pure bf16", "8-bit")) for n in names)
    assert any(n.startswith("QLoRA") for n in names)
    everything = {name for name, *_ in candidate_levers(job(method="full", seq_len=1024))}
    assert len(everything) == 8  # checkpointing, chunked loss, 8-bit AdamW, bf16, LoRA, freeze, QLoRA, context


def test_plan_cli_reads_a_model_directory_and_reports_trainable_parameters(tmp_path, capsys):
    from trainwise.llm import hf
    config = hf.resolve_config("qwen2.5-0.5b", **{k: v for k, v in TINY.items() if k != "head_dim"})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config.to_dict()))
    result = invoke(capsys, "plan", str(tmp_path / "model"), "--method", "lora", "--seq-len", "32", "--batch",
                    "2", "--gpu", "T4", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert 0 < report["parameters"]["trainable"] < report["parameters"]["total"]
    assert report["layouts"][0]["fits"] and report["peak"]["where"]
    assert sum(report["host_ram_bytes"].values()) > 0


def test_plan_cli_without_the_extra_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert_refused(invoke(capsys, "plan", "llama-3.1-8b", "--method", "lora"), "pip install 'trainwise[llm]'")


def test_an_unknown_config_path_is_refused(tmp_path, capsys):
    assert_refused(invoke(capsys, "plan", str(tmp_path / "nope" / "config.json")), "never downloads")


def test_overrides_on_a_model_are_applied_not_ignored(tmp_path, capsys):
    """`plan MODEL key=value` is a RunConfig with that key set (issue 36): the override reaches the job."""
    config = _tiny_config_dir(tmp_path)
    result = invoke(capsys, "plan", str(config), "--method", "lora", "--seq-len", "16", "--batch", "2", "--gpu",
                    "T4", "model.lora.rank=4", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["job"]["lora"]["rank"] == 4
    assert_refused(invoke(capsys, "plan", str(config), "model.nonsense=1"), "nonsense")


def _tiny_config_dir(tmp_path, layers: int = TINY["num_hidden_layers"]):
    from trainwise.llm import hf
    fields = {**{k: v for k, v in TINY.items() if k != "head_dim"}, "num_hidden_layers": layers}
    config = hf.resolve_config("qwen2.5-0.5b", **fields)
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(config.to_dict()))
    return tmp_path / "model"


def test_each_region_of_the_step_is_extended_on_its_own_line():
    # at 1-2 blocks the peak is in backward of the head, at 4 at the end of forward: extending the highest point
    # of the shallow traces misses it; the highest of the regions' extended lines does not
    from trainwise.plan.llm_estimate import extend
    from trainwise.plan.traced_step import StepTrace

    def trace(forward, head):
        parts = {"micro_batches": {"activations": max(forward, head)}, "forward": {"activations": forward},
                 "backward of the head": {"activations": head}, "optimizer": {"parameters": 1}}
        where = {"forward": "forward of lm_head", "backward of the head": "backward", "optimizer": "optimizer step",
                 "micro_batches": ""}
        return StepTrace(2, max(forward, head), parts["micro_batches"], max(forward, head), 1, 0, 0, 0, 0, 0, {}, 0,
                         0, 0, 0, "cpu", "fp32", part_breakdowns=parts, part_where=where)
    extended = extend(trace(forward=60, head=64), trace(forward=70, head=72), (1, 2), 4)
    assert extended.peak_bytes == 90 and extended.peak_where == "forward of lm_head"


@pytest.mark.parametrize("method", ["lora", "freeze"])
def test_model_facts_extended_from_two_depths_equal_the_whole_models(method):
    from trainwise.plan.llm_estimate import _facts, model_facts
    from trainwise.plan.llm_step import build_lm

    planned = job(method=method)
    assert traced_depths(planned) is not None
    assert model_facts(planned) == _facts(build_lm(planned, device="meta"))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_mixture_of_experts_model_plans_to_the_cpu_allocators_peak(method):
    """Mixtral-style routing (top-k experts, grouped matmuls over fused expert weights) traces on fake tensors."""
    from tests.llm.test_models import MOE

    planned = LmJob(**{**JOB_FIELDS, "model": MOE, "seq_len": 32, "batch_size": 2, "dtype": "fp32",
                       "precision": "fp32", "method": method})
    traced = trace_lm(planned, 2, device_kind="cpu")
    real = measured_peak_bytes(lm_step(planned, None, 2, device_kind="cpu"), torch.device("cpu"))
    assert traced.peak_bytes == pytest.approx(real, rel=0.01)


def test_the_sft_lora_recipe_and_plan_model_method_lora_are_the_same_job():
    """`plan sft-lora model.hf_config=M` and `plan M --method lora` (no --dtype, no --checkpointing) describe one
    job: the recipe's bf16 base, checkpointing and batch are the flags' defaults (issue 34 / 36). Both read
    through the CLI's one reading (cli/plan.plan_config) and job_from_config's one language-model branch."""
    from trainwise.cli.plan import plan_config
    from trainwise.plan.job import job_from_config

    recipe = job_from_config(plan_config("sft-lora", ["model.hf_config=llama-3.1-8b", "data.seq_len=2048"], {}))
    flags = job_from_config(plan_config("llama-3.1-8b", [], {"method": "lora"}))
    assert recipe == flags and flags.dtype == "bf16" and flags.gradient_checkpointing
    # the whole job, field by field: the base's dtype, the context, the batch and micro-batch, the method, the
    # precision (the runtime's rule for `auto`: bf16 on bf16 cards, fp16 on a T4)
    assert (flags.model, flags.seq_len, flags.batch_size, flags.micro_batch_size, flags.method, flags.lora.rank) \
        == ("llama-3.1-8b", 2048, 16, None, "lora", 16)
    assert (flags.precision, flags.precision_without_bf16, flags.optimizer) == ("bf16", "fp16", "adamw")
    full = job_from_config(plan_config("llama-3.1-8b", [], {"method": "full"}))
    assert full.dtype == "fp32" and not full.gradient_checkpointing  # fp32 master weights, bf16 autocast
    given = job_from_config(plan_config("llama-3.1-8b", ["model.gradient_checkpointing=false"],
                                        {"method": "lora", "dtype": "fp32"}))
    assert given.dtype == "fp32" and not given.gradient_checkpointing  # flags and overrides win


@pytest.mark.slow
def test_the_recipe_and_the_model_plan_the_same_job_end_to_end(tmp_path, capsys):
    """The same, as the user runs it: the two commands' JSON reports name one job, and its layouts compute in
    what runtime.precision gives each card for `auto` (bf16 where the card has it, fp16 on a T4)."""
    model = _tiny_config_dir(tmp_path, layers=2)  # traced whole: two plans stay quick
    common = ["--gpu", "T4", "--gpu", "L4", "--json"]
    by_recipe = invoke(capsys, "plan", "sft-lora", f"model.hf_config={model}", "data.seq_len=32",
                       "train.batch_size=2", *common)
    by_model = invoke(capsys, "plan", str(model), "--method", "lora", "--seq-len", "32", "--batch", "2", *common)
    assert by_recipe.returncode == 0 and by_model.returncode == 0, by_recipe.stderr + by_model.stderr
    report = json.loads(by_model.stdout)
    job = json.loads(by_recipe.stdout)["job"]
    assert job == report["job"]
    assert (job["dtype"], job["seq_len"], job["micro_batch_size"], job["method"], job["precision"]) == \
        ("bf16", 32, None, "lora", "bf16")
    assert {row["card"]: row["precision"] for row in report["layouts"]} == {"T4": "fp16", "L4": "bf16"}


@pytest.mark.slow
def test_precision_is_the_runtimes_rule_and_bf16_asked_leaves_a_t4_out(tmp_path, capsys):
    """No hand-coded `auto`: fp32 master weights compute in bf16 (train.master_weights, as launch/resolve.py
    resolves it), and bf16 asked leaves out the cards without it, or is refused when none has it."""
    from trainwise.cli.plan import plan_config
    from trainwise.plan.job import job_from_config

    model = _tiny_config_dir(tmp_path, layers=2)
    master = job_from_config(plan_config(str(model), ["model.dtype=bf16", "train.precision=fp32"], {}))
    assert master.dtype == "fp32" and master.precision == "bf16"
    asked = invoke(capsys, "plan", str(model), "--method", "lora", "--seq-len", "16", "--batch", "2", "--gpu", "T4",
                   "--gpu", "L4", "--precision", "bf16", "--json")
    assert [row["card"] for row in json.loads(asked.stdout)["layouts"]] == ["L4"]
    assert_refused(invoke(capsys, "plan", str(model), "--method", "lora", "--gpu", "T4", "--precision", "bf16"),
                   "no bf16")


def test_two_levers_that_fit_one_card_come_before_renting_more(monkeypatch):
    """When no lever alone fits the card asked about and two together do, the plan says so before FSDP or a
    bigger card."""
    from types import SimpleNamespace

    from trainwise.plan import advise_levers
    from trainwise.plan.advise_levers import Lever

    def traced(est, chosen, gpus, gpu, base_s, replan):
        names = {c[0] for c in chosen}
        fits = ("Small",) if names == {"gradient checkpointing", "QLoRA (4-bit base, CUDA + bitsandbytes)"} else ()
        return Lever(" + ".join(sorted(names)), "", 10, 1.0 + len(names), fits, any(c[3] for c in chosen),
                     levers=len(chosen))

    small = SimpleNamespace(name="Small", memory_bytes=8 * 2**30)
    monkeypatch.setattr(advise_levers, "_traced", traced)
    monkeypatch.setattr(advise_levers, "lever_seconds", lambda est, job, gpu, replan: 1.0)
    monkeypatch.setattr(advise_levers, "hardware_levers", lambda est, gpu, catalogue: [Lever("FSDP", "", 1, 0.5,
                                                                                           ("Small",), hardware=True)])
    monkeypatch.setattr(advise_levers, "combine", lambda *args: None)
    est = SimpleNamespace(job=job(method="lora", dtype="bf16", seq_len=1024))
    levers, _ = advise_levers.rank_levers(est, (small,), (), replan=None)  # every trace is made up above
    assert levers[0].levers == 2 and "gradient checkpointing" in levers[0].name and levers[1].name == "FSDP"


@pytest.mark.slow
def test_a_lora_step_is_planned_no_slower_than_full_fine_tuning():
    """LoRA's extra matmuls are priced as what they are: small next to the weight gradients it skips (issue 34:
    LoRA was planned ~2x slower than full). Llama-3.2-1B at 512 tokens, both at their usual dtypes."""
    from trainwise.plan.catalog import find_gpus, load_gpus
    from trainwise.cli.plan import plan_config
    from trainwise.plan.advise_layouts import layouts
    from trainwise.plan.job import job_from_config

    cards = find_gpus(load_gpus(), ["RTX4090", "H100-SXM", "T4"])
    times = {}
    for method in ("full", "lora"):
        planned = job_from_config(plan_config("llama-3.2-1b", [], {"method": method, "seq_len": 512, "batch_size": 2,
                                                                  "gradient_checkpointing": False}))
        rows = [row for row in layouts(estimate_lm(planned), cards, 1) if row.strategy == "single"]
        times[method] = {row.card: row.step_time_s for row in rows}
    for card in times["full"]:
        assert times["lora"][card] < 2 * times["full"][card], (card, times)
        assert times["lora"][card] <= times["full"][card], (card, times)
