"""The planner's one decision behind `train.strategy: auto`: DDP where a replica fits a card, FSDP where only
sharding fits, and the per-rank memory `trainwise plan --nproc N` shows."""
from dataclasses import replace

from tests.conftest import invoke, tiny_config
from trainwise.plan.catalog import load_gpus
from trainwise.plan.job import advice_inputs, estimate_job, job_from_config
from trainwise.plan.strategy import plan_strategies, strategy_for

GiB = 2**30


def _estimates():
    return advice_inputs(estimate_job(job_from_config(tiny_config()), ("cuda",)))


def _card(name, memory_gib):
    return next(g for g in load_gpus() if g.name.startswith(name)).model_copy(update={"memory_gib": memory_gib})


def test_ddp_where_a_replica_fits_fsdp_where_only_shards_do():
    est = _estimates()
    roomy = plan_strategies(est, _card("A100 80", 80), 4)
    assert roomy.recommended == "ddp" and roomy.rows["ddp"].fits
    # FSDP divides parameters, gradients and optimizer state: less per rank than a DDP replica
    assert roomy.rows["fsdp"].needed_bytes < roomy.rows["ddp"].needed_bytes
    # a job whose state is large next to the card: the replica no longer fits, the shards do
    curve = est.cuda_memory
    heavier = replace(curve, points=tuple((b, peak + 60 * GiB) for b, peak in curve.points),
                      optimizer_peak_bytes=curve.optimizer_peak_bytes + 60 * GiB)
    heavy = replace(est, sharded_state_bytes=est.sharded_state_bytes + 60 * GiB, cuda_memory=heavier)
    tight = plan_strategies(heavy, _card("A100 80", 80), 4)
    assert not tight.rows["ddp"].fits and tight.rows["fsdp"].fits and tight.recommended == "fsdp"
    assert "FSDP" in tight.reason


def test_auto_on_one_process_is_single_and_on_a_card_the_catalog_knows_ddp():
    config = tiny_config()
    assert strategy_for(config, "NVIDIA H100 80GB HBM3", 80 * GiB, 1)[0] == "single"
    assert strategy_for(config, "NVIDIA H100 80GB HBM3", 80 * GiB, 8)[0] == "ddp"


def test_plan_nproc_shows_per_rank_memory_and_the_choice(capsys):
    result = invoke(capsys, "plan", "breast-cancer", "--gpu", "A100-80GB", "--nproc", "4")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # the console wraps at its width
    assert "With 4 ranks per node" in text and "DDP" in text and "FSDP" in text
    assert "→ ddp" in text
