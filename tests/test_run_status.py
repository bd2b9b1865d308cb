"""What readers are told about a run's state (run_status.py) and the final weights file (run_weights.py), through
RunDir: a damaged summary, a run nobody writes any more, a directory that already holds a run, tied weights."""
from __future__ import annotations

import pytest
import torch

from trainwise.errors import RunDirError, RunDirWarning
from trainwise.rundir.layout import RunDir


def test_a_damaged_summary_reads_as_empty_and_is_named_once(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.summary_path.write_text('{"status": "compl', encoding="utf-8")  # cut short by a full disk
    with pytest.warns(RunDirWarning, match="summary.json is damaged"):
        assert run.read_summary() == {}
    assert run.status() == "unknown"
    assert len(run.problems) == 1 and "A resume rewrites it" in run.problems[0]
    run.summary_path.write_text("[1, 2]", encoding="utf-8")
    with pytest.warns(RunDirWarning, match="not a JSON object"):
        assert run.read_summary() == {}


def test_running_is_interrupted_once_no_process_writes_the_run(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.write_summary({"status": "running", "steps": 40, "max_steps": 100})
    assert run.status() == "running" and "still being trained" in run.liveness_note()
    run.release_writer()  # what a SIGKILL does: the kernel drops the lock, the summary still says running
    reader = RunDir(run.path)
    assert reader.status() == "interrupted"
    note = reader.liveness_note()
    assert "at step 40 of 100" in note and "--overwrite" in note  # no checkpoint: train again, not resume
    run.write_summary({"status": "completed"})
    assert RunDir(run.path).status() == "completed" and RunDir(run.path).liveness_note() is None


@pytest.mark.parametrize("summary, checkpoint, advice", [
    ({"status": "completed"}, False, "completed run, which cannot be resumed"),
    ({"status": "running"}, True, "trainwise resume"),
    (None, False, "Choose another --out, or pass --overwrite"),
])
def test_an_occupied_directory_is_refused_with_advice_that_fits_what_it_holds(tmp_path, summary, checkpoint, advice):
    run = RunDir.create(tmp_path / "run")
    run.log_metrics({"step": 1})
    if summary is not None:
        run.write_summary(summary)
    if checkpoint:
        run.save_checkpoint(5, lambda f: f.write(b"state"), is_best=False, keep_last=1)
    run.release_writer()
    with pytest.raises(RunDirError, match="already holds files") as refused:
        RunDir.refuse_existing(run.path, overwrite=False)
    assert advice in str(refused.value)
    RunDir.refuse_existing(run.path, overwrite=True)  # nobody writes it: replacing it is the user's call


def test_a_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("notes")
    with pytest.raises(RunDirError, match="is not a directory"):
        RunDir.refuse_existing(tmp_path / "run", overwrite=True)


def test_tied_weights_are_saved_whole_and_load_into_a_fresh_model(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7, bias=False))
    model[1].weight = model[0].weight  # the output layer is the embedding, as in GPT-2
    run = RunDir.create(tmp_path / "run")
    run.write_model(model.state_dict(), metadata={"step": "3"})
    state = run.read_model()
    assert state["0.weight"].data_ptr() != state["1.weight"].data_ptr()
    fresh = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7, bias=False))
    fresh.load_state_dict(state)
    assert torch.equal(fresh[0].weight, model[0].weight) and torch.equal(fresh[1].weight, model[0].weight)
