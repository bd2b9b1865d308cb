"""From a recipe to the job's estimates: steps, micro-batch, precision, and the memory line over batch sizes."""
import pytest

from trainwise.plan.job import estimate_job, job_from_config
from trainwise.plan.memory import trace_step
from trainwise.recipes import load_recipe


def test_job_reads_steps_micro_batch_precision_and_checkpointing_from_the_config():
    job = job_from_config(load_recipe("breast-cancer", ["train.micro_batch_size=8",
                                                        "model.gradient_checkpointing=true"]))
    assert job.total_steps == 300 and job.batch_size == 32
    assert job.step.micro_batch_size == 8 and job.step.accumulation_steps == 4
    assert job.step.precision == "bf16" and job.cpu_precision == "fp32"
    assert any("auto" in note for note in job.notes)
    assert job.step.build_model().gradient_checkpointing is True
    assert job.step.optimizer == "adamw" and job.step.optimizer_args["lr"] == 0.002


def test_epochs_become_steps_over_the_training_split():
    job = job_from_config(load_recipe("breast-cancer", ["train.max_steps=null", "train.epochs=3",
                                                        "train.precision=fp32"]))
    assert job.steps_per_epoch == job.num_train // 32  # the last partial batch never makes a step
    assert job.total_steps == 3 * job.steps_per_epoch
    assert job.step.precision == "fp32" and not job.notes
    assert job.dataset_bytes >= 569 * 30 * 4


def test_memory_curve_through_traced_sizes_bounds_the_sizes_between():
    job = job_from_config(load_recipe("breast-cancer", ["model.args.hidden=[512,512]", "train.batch_size=64"]))
    estimate = estimate_job(job, ("cuda",))
    model = estimate.memory["cuda"]
    assert [t.micro_batch_size for t in model.traces] == [1, 64]
    assert model.peak_bytes(64) == model.traces[-1].peak_bytes
    actual = trace_step(job.step.on("cuda").at_micro_batch(24)).peak_bytes
    assert actual <= model.peak_bytes(24) <= 1.1 * actual  # between traces: a little above, never below
    assert estimate.flops_per_sample > 0 and estimate.parameter_count == 30 * 512 + 512 + 512 * 512 + 512 + 512 * 2 + 2


@pytest.mark.parametrize("epochs", ["3", "2.5"])
def test_the_plan_prices_the_steps_the_trainer_runs(tmp_path, epochs):
    from trainwise.rundir.layout import RunDir
    from trainwise.launch import build_trainer

    config = load_recipe("breast-cancer", ["train.max_steps=null", f"train.epochs={epochs}",
                                           "telemetry.enabled=false"])
    job = job_from_config(config)
    trainer = build_trainer(config, RunDir(tmp_path / "run"))
    assert (job.steps_per_epoch, job.total_steps) == (trainer.steps_per_epoch, trainer.max_steps)


def test_the_plan_asks_the_trainers_precision_rule(monkeypatch):
    import trainwise.runtime.precision as precision

    asked = []

    def rule(requested, kind, *, bf16_native, device_name="this GPU"):
        asked.append((requested, kind, bf16_native))
        return "fp16" if kind == "cuda" else "bf16"

    monkeypatch.setattr(precision, "choose_precision", rule)
    job = job_from_config(load_recipe("breast-cancer", ["train.precision=auto"]))
    assert job.step.precision == "fp16" and job.cpu_precision == "bf16"
    assert ("auto", "cuda", True) in asked and ("auto", "cpu", False) in asked
