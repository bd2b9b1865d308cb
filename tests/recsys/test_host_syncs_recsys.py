"""The recommenders' training steps never wait for the device between log steps (HostSyncCounter sees every
`.item()`, `bool(t)`, `float(t)`, `.tolist()`, `.cpu()`, `.numpy()`): the full and the sampled softmax, GRU4Rec
and DIN. The sparse item table is the documented exception: SparseAdam has no `found_inf`, so its step reads one
flag a step."""
import pytest

from trainwise.recipes import load_recipe
from trainwise.train.loop.host_syncs import HostSyncCounter
from trainwise.launch.runs import train_run

TINY = ["data.args.users=300", "data.args.items=200", "data.args.events=8000", "data.args.categories=5",
        "data.args.max_eval_queries=100", "train.max_steps=12", "train.epochs=null", "eval.every_steps=null",
        "eval.every_epoch=false", "train.log_every=6", "telemetry.enabled=false", "train.sanity=false",
        "checkpoint.every_steps=null", "train.device=cpu"]
SAMPLED = ["model.args.loss=sampled", "model.args.num_sampled=50"]
MODELS = {"sasrec": ("shop-sasrec", []), "sasrec-sampled": ("shop-sasrec", SAMPLED),
          "sasrec-sampled-popularity": ("shop-sasrec", [*SAMPLED, "model.args.sampling=popularity"]),
          "gru4rec": ("shop-sasrec", ["model.name=gru4rec", "model.args={}"]), "din": ("shop-din", [])}


def _syncs(tmp_path, recipe, overrides):
    counter = HostSyncCounter()
    with counter:
        train_run(load_recipe(recipe, [*TINY, *overrides]), tmp_path / "run", callbacks=[counter.step_marker()])
    return counter


@pytest.mark.parametrize("name", list(MODELS))
def test_no_host_sync_between_log_steps(tmp_path, name, one_thread):
    counter = _syncs(tmp_path, *MODELS[name])
    between = {step: calls for step, calls in counter.by_step.items() if step and step not in (6, 12)}
    assert between == {}, f"host syncs between log steps: {between}"
    assert counter.by_step.get(6), "the log step reads the device (the count would be blind otherwise)"


def test_the_sparse_item_table_reads_one_flag_a_step(tmp_path, one_thread):
    counter = _syncs(tmp_path, "shop-sasrec", [*SAMPLED, "model.args.sparse_embeddings=true"])
    between = {step: len(calls) for step, calls in counter.by_step.items() if step and step not in (6, 12)}
    assert set(between) == {1, 2, 3, 4, 5, 7, 8, 9, 10, 11} and set(between.values()) == {1}, between
