"""Which weights `trainwise eval --checkpoint best|last` loads: sharded (train.strategy=fsdp) checkpoint
directories read whole in one process, and a run without a `best` evaluated on its last weights, with a note."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import tiny_config
from trainwise.errors import RunDirError
from trainwise.evaluate.run_eval import evaluate_run, load_weights
from trainwise.rundir.layout import RunDir

pytestmark = pytest.mark.slow  # one tiny fsdp training run (~10 s of CPU), shared by the module


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory) -> RunDir:
    """A one-process fsdp run: checkpoints at steps 15 and 20 are torch.distributed.checkpoint directories."""
    from trainwise.launch.runs import train_run

    config = tiny_config(train={"max_steps": 20, "batch_size": 32, "log_every": 5, "strategy": "fsdp"},
                         checkpoint={"every_steps": 5, "keep_last": 2})
    run = train_run(config, tmp_path_factory.mktemp("runs") / "fsdp")
    run.release_writer()
    return run


def _copy(run: RunDir, to) -> RunDir:
    shutil.copytree(run.path, to, symlinks=True)
    return RunDir(to)


def _point(run: RunDir, name: str, step: int | None) -> None:
    link = run.checkpoints_dir / name
    link.unlink(missing_ok=True)
    if step is not None:
        os.symlink(run.checkpoint_dirs.path(step).name, link)


def _shard_weights(run: RunDir, directory):
    """What the engine itself loads from a sharded checkpoint, into a freshly built plain model."""
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.train.parallel.sharded_checkpoint import load_model

    config = run.read_config()
    model = build_model(config, build_data(config).spec)
    load_model(model, directory)
    return model.state_dict()


def test_sharded_best_and_last_load_the_directories_they_name(sharded_run, tmp_path):
    run = _copy(sharded_run, tmp_path / "run")
    assert [s for s, _ in run.checkpoint_dirs.steps()] == [15, 20] and not run.checkpoint_path("best").exists()
    _point(run, "best", 15)  # best is an older step than last

    best, step, where = load_weights(run, "best")
    assert step == 15 and where == run.checkpoint_dirs.path(15)
    expected = _shard_weights(run, run.checkpoint_dirs.path(15))
    assert best.keys() == expected.keys() and all(best[k].equal(expected[k]) for k in best)

    last, step, where = load_weights(run, "last")
    final = run.read_model()  # the gathered, unsharded weights written at the end: the same as step 20's
    assert step == 20 and where == run.checkpoint_dirs.path(20)
    assert all(last[k].equal(final[k]) for k in final) and not all(last[k].equal(best[k]) for k in best)

    result = evaluate_run(run, checkpoint="best")
    assert result["step"] == 15 and result["weights"].endswith("step-00000015") and 0 <= result["accuracy"] <= 1


def test_sharded_last_that_names_a_removed_step_falls_back_with_a_note(sharded_run, tmp_path):
    run = _copy(sharded_run, tmp_path / "run")
    shutil.rmtree(run.checkpoint_dirs.path(20))
    notes: list[str] = []
    _, step, _ = load_weights(run, "last", notes)
    assert step == 15 and notes and "step-00000015" in notes[0]


def test_a_sharded_run_without_best_is_evaluated_on_its_last_weights(sharded_run, tmp_path):
    run = _copy(sharded_run, tmp_path / "run")
    _point(run, "best", None)  # e.g. every validation loss was NaN: no step was ever the best
    result = evaluate_run(run, checkpoint="best")
    assert result["step"] == 20 and result["weights"].endswith("step-00000020")
    notes = [w["message"] for w in result["warnings"] if w["kind"] == "checkpoint_fallback"]
    assert notes and "no `best` checkpoint" in notes[0] and "last" in notes[0]


def test_a_run_without_any_checkpoint_but_final_weights_falls_back_to_them(sharded_run, tmp_path):
    run = _copy(sharded_run, tmp_path / "run")
    shutil.rmtree(run.checkpoints_dir)
    notes: list[str] = []
    state, _, where = load_weights(run, "best", notes)
    assert where == run.model_path and "final" in notes[0]
    run.model_path.unlink()
    with pytest.raises(RunDirError, match="no `best` checkpoint and holds no weights at all"):
        load_weights(run, "best")
