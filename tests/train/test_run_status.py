"""A run's status says the truth: summary.json follows every checkpoint, a killed run reads as `interrupted`
with the command that continues it, the final save can be cut anywhere and resumed to the same weights, and
`eval --checkpoint final` evaluates the final step's weights even when early stopping restored the best."""
import json
import shutil

import pytest
from safetensors.torch import load_file

from tests.conftest import train_until_killed, invoke, tiny_config
from trainwise.rundir.layout import RunDir
from trainwise.launch.runs import resume_run, train_run

KILL_ARGS = ["breast-cancer", "train.max_steps=100000", "train.log_every=1", "eval.every_steps=4",
             "eval.every_epoch=false", "checkpoint.every_steps=4", "telemetry.enabled=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`trained(make_config, to)`: a copy at `to` of the run `make_config()` trains, trained once a module."""
    runs = {}

    def copy(make_config, to):
        if make_config not in runs:
            runs[make_config] = train_run(make_config(), tmp_path_factory.mktemp("trained") / "run").path
        shutil.copytree(runs[make_config], to)
        return RunDir.open(to)

    return copy


def _summary(out):
    try:
        return json.loads((out / "summary.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


@pytest.mark.slow
def test_a_sigkilled_run_shows_its_progress_and_reads_as_interrupted_with_the_resume_command(tmp_path, capsys,
                                                                                             trained):
    out = tmp_path / "killed"
    train_until_killed(KILL_ARGS, out, lambda: _summary(out).get("steps", 0) >= 8)

    summary = _summary(out)
    assert summary["status"] == "running"  # as the killed writer left it: no process could say otherwise
    assert summary["steps"] >= 8 and summary["steps"] % 4 == 0  # written at a checkpoint, not at the start
    assert summary["last_checkpoint_step"] == summary["steps"]
    assert summary["timings"]["wall_s"] > 0 and summary["final"]["step"] == summary["steps"]
    assert summary["last_train"]["loss"] > 0 and summary["last_train"]["step"] == summary["steps"]
    steps, resume = summary["steps"], f"trainwise resume {out}"
    assert RunDir.open(out).status() == "interrupted"

    diagnosed = invoke(capsys, "diagnose", str(out), "--json")
    assert diagnosed.returncode == 0, diagnosed.stderr
    result = json.loads(diagnosed.stdout)
    assert result["status"] == "interrupted"
    [finding] = [f for f in result["findings"] if f["code"] == "run_interrupted"]
    assert finding["fixes"] == [resume] and f"interrupted at step {steps}" in finding["detail"]
    text = invoke(capsys, "diagnose", str(out))
    assert "interrupted" in text.stdout and resume in " ".join(text.stdout.split())

    other = tmp_path / "done"
    trained(tiny_config, other)
    compared = invoke(capsys, "compare", str(out), str(other), "--json")
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout)
    assert result["metrics"]["status"] == ["interrupted", "completed"]
    assert result["metrics"]["steps"][0] == steps
    assert len(result["notes"]) == 1 and resume in result["notes"][0]

    evaluated = invoke(capsys, "eval", str(out), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    [note] = [w["message"] for w in json.loads(evaluated.stdout)["warnings"] if "interrupted" in w["message"]]
    assert resume in note

    reported = invoke(capsys, "report", str(out), "--format", "md")
    assert reported.returncode == 0, reported.stderr
    report = (out / "report.md").read_text()
    assert "interrupted" in report and resume in report


def test_summary_is_rewritten_at_every_checkpoint_while_the_run_trains(tmp_path):
    seen = []

    from trainwise.train.callbacks.base import Callback

    class ReadSummary(Callback):
        def on_checkpoint(self, trainer, path):
            seen.append(_summary(trainer.run_dir.path))

    train_run(tiny_config(eval={"every_steps": 10, "every_epoch": False}), tmp_path / "run", callbacks=[ReadSummary()])
    assert [s["status"] for s in seen] == ["running"] * 3
    assert [s["steps"] for s in seen] == [10, 20, 30]
    assert [s["final"]["step"] for s in seen] == [10, 20, 30]  # the last validation metrics so far
    assert _summary(tmp_path / "run")["status"] == "completed"


def _weights(out):
    return load_file(out / "model.safetensors")


def _assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), f"{name} differs after resume"


def _early_stopping_config():
    # min_delta so large that nothing after the first evaluation improves: stops at step 6, best step 2
    return tiny_config(train={"max_steps": 30, "batch_size": 32, "log_every": 2}, eval={
        "every_steps": 2, "early_stopping": {"enabled": True, "patience": 2, "min_delta": 10.0}})


@pytest.mark.parametrize("make_config", [tiny_config, _early_stopping_config], ids=["to_the_end", "early_stop"])
def test_a_second_ctrl_c_in_the_final_save_leaves_a_run_that_resumes_to_the_same_weights(tmp_path, monkeypatch,
                                                                                         make_config, trained):
    straight = trained(make_config, tmp_path / "straight")
    expected = _summary(straight.path)

    real_write_model = RunDir.write_model

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(RunDir, "write_model", interrupted)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        train_run(make_config(), cut)
    summary = _summary(cut)
    assert summary["status"] == "stopped" and summary["steps"] == expected["steps"]
    assert summary["last_checkpoint_step"] == expected["steps"]
    assert "second Ctrl-C" in summary["message"] and f"trainwise resume {cut}" in summary["message"]
    assert not (cut / "model.safetensors").exists()

    monkeypatch.setattr(RunDir, "write_model", real_write_model)
    resume_run(cut)
    resumed = _summary(cut)
    assert resumed["status"] == "completed" and resumed["steps"] == expected["steps"]
    assert resumed["restored_best"] == expected["restored_best"] and resumed["message"] == expected["message"]
    _assert_same_weights(_weights(straight.path), _weights(cut))


def test_a_kill_in_the_final_save_leaves_the_checkpointed_state_and_resume_completes_it(tmp_path, monkeypatch,
                                                                                       trained):
    straight = trained(tiny_config, tmp_path / "straight")

    class Killed(Exception):
        """What a reader sees after a SIGKILL here: nothing past the last write happened."""

    real_write_summary = RunDir.write_summary
    dead = []

    def write_summary(self, summary):
        if summary["status"] == "completed" or dead:  # killed here: no later write happens either
            dead.append(summary["status"])
            raise Killed
        real_write_summary(self, summary)

    monkeypatch.setattr(RunDir, "write_summary", write_summary)
    cut = tmp_path / "cut"
    with pytest.raises(Killed):
        train_run(tiny_config(), cut)
    summary = _summary(cut)
    assert summary["status"] == "running" and summary["steps"] == 30 and summary["last_checkpoint_step"] == 30
    assert dead == ["completed", "failed"]  # (a process that lived on would have said `failed`)

    monkeypatch.setattr(RunDir, "write_summary", real_write_summary)
    resume_run(cut)
    assert _summary(cut)["status"] == "completed"
    _assert_same_weights(_weights(straight.path), _weights(cut))


def test_a_resumed_run_counts_the_wall_time_of_its_earlier_sessions(tmp_path):
    from trainwise.train.callbacks.base import Callback

    class StopAt(Callback):
        def on_step_end(self, trainer):
            if trainer.step == 10:
                trainer.request_stop("signal:SIGTERM")

    out = tmp_path / "run"
    train_run(tiny_config(), out, callbacks=[StopAt()])
    first = _summary(out)
    assert first["status"] == "stopped"
    resume_run(out)
    assert _summary(out)["timings"]["wall_s"] > first["timings"]["wall_s"]


def test_eval_final_evaluates_the_final_step_when_early_stopping_restored_the_best(tmp_path, capsys, trained):
    from trainwise.evaluate.run_eval import evaluate_run

    run = trained(_early_stopping_config, tmp_path / "run")
    summary = _summary(run.path)
    assert summary["restored_best"] and summary["best"]["step"] == 2 and summary["steps"] == 6

    final = evaluate_run(run, split="val", checkpoint="final")
    best = evaluate_run(run, split="val", checkpoint="best")
    assert (final["step"], best["step"]) == (6, 2)
    assert final["log_loss"] != best["log_loss"]
    # model.safetensors holds the restored best weights and says so; the final step's are in `last`
    from safetensors import safe_open
    with safe_open(str(run.model_path), framework="pt") as f:
        assert f.metadata()["step"] == "2" and f.metadata()["restored_best"] == "True"
    assert final["weights"] == str(run.checkpoint_path("last"))

    shown = invoke(capsys, "eval", str(run.path), "--split", "val", "--checkpoint", "final")
    assert shown.returncode == 0, shown.stderr
    assert "final weights (step 6)" in shown.stdout
    shown = invoke(capsys, "eval", str(run.path), "--split", "val", "--checkpoint", "best")
    assert "best weights (step 2)" in shown.stdout


def test_eval_final_without_a_restore_reads_the_final_weights_and_their_step(tmp_path, trained):
    from trainwise.evaluate.run_eval import evaluate_run

    run = trained(tiny_config, tmp_path / "run")
    final = evaluate_run(run, split="val", checkpoint="final")
    assert final["step"] == 30 and final["weights"] == str(run.model_path)


def test_eval_final_says_so_when_the_final_step_weights_are_gone(tmp_path, trained):
    from trainwise.errors import RunDirError
    from trainwise.evaluate.run_eval import evaluate_run

    run = trained(_early_stopping_config, tmp_path / "run")
    for _, path in run.step_checkpoints():
        path.unlink()
    run.checkpoint_path("last").unlink()
    with pytest.raises(RunDirError, match=r"final weights .* \(step 6\) are gone.*--checkpoint best \(step 2\)"):
        evaluate_run(run, split="val", checkpoint="final")


def test_the_summary_follows_metrics_as_they_grow_without_rereading_them(tmp_path):
    from trainwise.train.loop.summary import RunSummary

    run = RunDir(tmp_path)
    tracker = RunSummary()
    run.metrics_path.write_text('{"step": 1, "split": "train", "loss": 2.0}\n'
                                '{"step": 1, "split": "val", "loss": 3.0}\n')
    assert tracker._newest_records(run)["val"]["loss"] == 3.0
    with open(run.metrics_path, "a") as f:
        f.write('{"step": 2, "split": "train", "loss": 1.5}\n{"step": 3, "split": "tr')  # the last one mid-append
    newest = tracker._newest_records(run)
    assert newest["train"]["step"] == 2 and newest["val"]["step"] == 1
    with open(run.metrics_path, "a") as f:
        f.write('ain", "loss": 1.0}\n')
    assert tracker._newest_records(run)["train"]["step"] == 3
    run.metrics_path.write_text('{"step": 1, "split": "train", "loss": 2.0}\n')  # a resume dropped records
    assert tracker._newest_records(run) == {"train": {"step": 1, "split": "train", "loss": 2.0}}


def test_a_run_killed_before_its_first_checkpoint_is_not_sent_to_resume(tmp_path):
    from trainwise.rundir.lock import liveness_note

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.summary_path.write_text(json.dumps({"status": "running", "steps": 0, "max_steps": 30}))
    assert run.status() == "interrupted" and not run.has_checkpoint()
    note = run.liveness_note()
    assert "interrupted at step 0 of 30" in note and "nothing to resume" in note and "--overwrite" in note
    assert "trainwise resume" not in note
    assert "trainwise resume" in liveness_note(run.path, None, 8, 30)
