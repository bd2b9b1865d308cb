"""Sparse item embeddings (`model.args.sparse_embeddings=true`): the item table's gradient holds only the rows
a batch looked up, SparseAdam updates them, the rest of the model keeps its optimizer, and a run stopped
mid-way resumes to the same weights, bit for bit, as one trained straight through."""
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import invoke
from tests.recsys.test_resume import StopAt
from trainwise.plan.job import estimate_job, job_from_config
from trainwise.plan.memory import trace_step
from trainwise.plan.traced_step import TrainingStep
from trainwise.plan.probe import measured_peak_bytes
from trainwise.recipes import load_recipe
from trainwise.recsys.models import SASRec
from trainwise.train.callbacks.base import Callback
from trainwise.train.step.optim import SplitOptimizer
from trainwise.launch.runs import resume_run, train_run

OVERRIDES = ["data.args.users=120", "data.args.items=80", "data.args.events=3000", "data.args.categories=4",
             "model.args.loss=sampled", "model.args.num_sampled=16", "model.args.sampling=popularity",
             "model.args.sparse_embeddings=true", "model.args.hidden=16", "model.args.layers=1",
             "train.max_steps=24", "train.batch_size=32", "train.grad_clip_norm=1.0",
             "eval.every_steps=8", "checkpoint.every_steps=8", "eval.early_stopping.enabled=false",
             "telemetry.enabled=false", "train.sanity=false"]


class WatchItemGradients(Callback):
    """Records the layout of the item table's gradient when backward has made it, inside the step."""

    def __init__(self):
        self.layouts, self.rows, self.optimizer = [], [], None

    def on_fit_start(self, trainer) -> None:
        self.optimizer = trainer.optimizer
        table = trainer.model.item_embedding.weight
        table.register_post_accumulate_grad_hook(self._seen)

    def _seen(self, parameter) -> None:
        self.layouts.append(parameter.grad.layout)
        self.rows.append(parameter.grad.coalesce().indices().shape[1])


def test_sparse_item_table_trains_with_sparse_adam_and_resumes_bit_identically(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = load_recipe("shop-sasrec", OVERRIDES)
        watch = WatchItemGradients()
        straight = train_run(config, tmp_path / "straight", callbacks=[watch])
        assert straight.read_summary()["status"] == "completed"
        stopped = train_run(config, tmp_path / "stopped", callbacks=[StopAt(11)])  # mid-epoch, off a checkpoint
        assert stopped.read_summary()["status"] == "stopped"
        resume_run(tmp_path / "stopped")
    finally:
        torch.set_num_threads(threads)
    assert watch.layouts and set(watch.layouts) == {torch.sparse_coo}
    assert max(watch.rows) < 81  # only the rows the batch and its negatives touched, never the whole table
    assert isinstance(watch.optimizer, SplitOptimizer)
    assert isinstance(watch.optimizer.sparse, torch.optim.SparseAdam)
    assert watch.optimizer.dense.defaults.get("fused")  # the dense part keeps the fused kernel
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "stopped" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _step(items: int, loss: str, batch: int, sparse: bool = False) -> TrainingStep:
    return TrainingStep(build_model=lambda: SASRec(items, 50, hidden=64, loss=loss, num_sampled=256,
                                                   sparse_embeddings=sparse),
                        input_shape=(50,), input_dtype=torch.int64, num_classes=items, vocabulary_size=items + 1,
                        target_shape=(50,), micro_batch_size=batch)


@pytest.mark.slow
def test_sampled_softmax_needs_far_less_memory_at_a_large_catalogue():
    # planned (fake tensors, the planner's own trace of the Trainer's step): 100k items, 64 x 50 positions
    full, sampled = trace_step(_step(100_000, "full", 64)), trace_step(_step(100_000, "sampled", 64))
    # the [64, 100k, 50] logits (saved activations) and their softmax's gradient (temporaries at the peak)
    assert full.breakdown["activations"] + full.breakdown["temporaries"] > 3e9
    assert sampled.peak_bytes * 10 < full.peak_bytes
    # the item table and its two Adam moments are counted the same either way, and with sparse gradients
    # (SparseAdam keeps dense exp_avg and exp_avg_sq: Adam's bytes)
    sparse = trace_step(_step(100_000, "sampled", 64, sparse=True))
    table = 100_001 * 64 * 4
    for trace in (full, sampled, sparse):
        assert trace.parameter_bytes > table and trace.optimizer_state_bytes >= 2 * trace.parameter_bytes
    assert sparse.optimizer_state_bytes == sampled.optimizer_state_bytes
    # measured (the CPU allocator's peak over two real steps), smaller: 20k items, 16 x 50 positions
    cpu = torch.device("cpu")
    measured_full = measured_peak_bytes(_step(20_000, "full", 16), cpu)
    measured_sampled = measured_peak_bytes(_step(20_000, "sampled", 16), cpu)
    assert measured_sampled * 3 < measured_full


PLAN_SMALL = ["data.args.users=120", "data.args.items=300", "data.args.events=3000", "data.args.categories=5",
              "train.batch_size=16", "model.args.loss=sampled", "model.args.num_sampled=64",
              "model.args.sampling=popularity"]


def test_plan_counts_the_sparse_table_and_its_sparse_adam_moments():
    dense = estimate_job(job_from_config(load_recipe("shop-sasrec", PLAN_SMALL)), device_kinds=("cpu",))
    sparse = estimate_job(job_from_config(load_recipe("shop-sasrec", [*PLAN_SMALL, "model.args.sparse_embeddings=true"])),
                          device_kinds=("cpu",))
    assert sparse.parameter_bytes == dense.parameter_bytes > 301 * 64 * 4  # the item table is in it
    assert sparse.optimizer_state_bytes == dense.optimizer_state_bytes >= 2 * sparse.parameter_bytes


def test_sparse_embeddings_without_the_sampled_loss_is_refused_with_exit_2(tmp_path, capsys):
    result = invoke(capsys, "train", "shop-sasrec", "--out", str(tmp_path / "run"), *PLAN_SMALL[:4],
                    "model.args.sparse_embeddings=true", "train.max_steps=2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "model.args.loss=sampled" in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
