"""`trainwise train / resume / recipes` as a user runs them, including every kind of bad input."""
import json

import pytest

from tests.conftest import assert_refused, invoke, run_cli

FAST = ["train.max_steps=30", "train.log_every=10", "eval.every_steps=10", "telemetry.enabled=false"]


def test_train_writes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "bc"
    result = invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "completed after 30 steps" in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "events.jsonl", "summary.json", "model.safetensors"):
        assert (out / name).is_file(), name
    assert (out / "checkpoints" / "last.pt").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 30
    # config.yaml is the resolved config: defaults filled in, overrides applied
    assert "max_steps: 30" in (out / "config.yaml").read_text()
    assert "micro_batch_size" in (out / "config.yaml").read_text()


def test_an_existing_run_is_never_overwritten_silently(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    assert_refused(invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out)), "already holds files", "--overwrite")
    assert (out / "precious.txt").read_text() == "keep me"
    # --overwrite replaces an earlier run, never a folder of the user's files (issue 28)
    assert_refused(invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out), "--overwrite"),
             "not a trainwise run", "precious.txt")
    assert (out / "precious.txt").read_text() == "keep me"


def test_resume_of_a_completed_run_isassert_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out)).returncode == 0
    assert_refused(invoke(capsys, "resume", str(out)), "already completed")
    assert_refused(invoke(capsys, "resume", str(tmp_path / "nope")), "not a run directory")


@pytest.mark.parametrize("args, phrases", [
    (["digitz"], ["unknown recipe 'digitz'", "Did you mean 'digits'", "breast-cancer"]),
    (["digits", "optim.lrr=0.1"], ["unknown key 'optim.lrr'", "Did you mean 'lr'"]),
    (["digits", "optim.lr=fast"], ["optim.lr", "valid number"]),
    (["digits", "optim.name=lamb"], ["optim.name", "'adamw', 'adam' or 'sgd'"]),
    (["digits", "train.micro_batch_size=128"], ["micro_batch_size (128) is larger than batch_size (64)"]),
    (["digits", "schedule.warmup_steps=700"], ["warmup_steps (700) must be smaller than train.max_steps (600)"]),
    (["digits", "model.factory=no_such_pkg.models:build"], ["model.factory", "cannot import module 'no_such_pkg.models'"]),
    (["digits", "model.factory=build_it"], ["not of the form package.module:function"]),
    (["digits", "model.args.widht=3"], ["model.args", "takes no argument 'widht'", "channels"]),
    (["digits", "data.factory=tests.e2e.user_data:bad_labels", "model.name=mlp", "model.args={}"],
     ["label 7 at sample", "outside the 3 classes"]),
    (["digits", "data.num_workers=-1"], ["data.num_workers", "-1 workers", "auto"]),
    (["digits", "data.num_workers=2147483648"], ["data.num_workers", "2 per usable core", "auto"]),
    (["digits", "data.num_workers=1024"], ["data.num_workers=1024", "cores, so at most", "data.num_workers=auto"]),
])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, args, phrases):
    out = tmp_path / "never"
    assert_refused(invoke(capsys, "train", *args, "--out", str(out)), *phrases)
    assert not out.exists()  # nothing was created for a run that could not start


def test_unknown_key_in_a_yaml_file_names_the_file(tmp_path, capsys):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("train:\n  max_steps: 10\n  batchsize: 8\n")
    assert_refused(invoke(capsys, "train", str(recipe), "--out", str(tmp_path / "r")),
             str(recipe), "train.batchsize: unknown key", "Did you mean 'batch_size'")


def test_users_own_model_and_data_through_yaml(tmp_path, capsys):
    recipe = tmp_path / "own.yaml"
    recipe.write_text(
        "model:\n  factory: tests.e2e.user_data:tiny_model\n  args: {width: 12}\n"
        "data:\n  factory: tests.e2e.user_data:good\n"
        "train: {max_steps: 12, batch_size: 16, log_every: 4}\n"
        "eval: {every_steps: 6}\ntelemetry: {enabled: false}\n")
    result = invoke(capsys, "train", str(recipe), "--out", str(tmp_path / "own"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "own" / "summary.json").read_text())["steps"] == 12


def test_recipes_and_help(capsys):
    listed = invoke(capsys, "recipes")
    assert listed.returncode == 0 and "digits" in listed.stdout and "breast-cancer" in listed.stdout
    train_help = invoke(capsys, "train", "--help")
    assert train_help.returncode == 0
    assert "optim.lr = 0.001: Peak learning rate" in " ".join(train_help.stdout.split())
    helped = run_cli("--help")
    assert helped.returncode == 0 and "train" in helped.stdout and "resume" in helped.stdout


def _train_until_first_metrics(out):
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "trainwise", "train", "breast-cancer", "train.max_steps=1000000",
                             "train.log_every=1", "eval.every_steps=1000", "telemetry.enabled=false", "--out",
                             str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_a_run_stopped_by_sigterm_exits_75_so_schedulers_do_not_take_it_for_a_success(tmp_path):
    import signal

    out = tmp_path / "run"
    proc = _train_until_first_metrics(out)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, (proc.returncode, stdout, stderr)
    assert "stopped after" in stdout and f"trainwise resume {out}" in stdout
    assert json.loads((out / "summary.json").read_text())["status"] == "stopped"


def test_a_second_ctrl_c_exits_130_and_says_what_was_kept(tmp_path, capsys, monkeypatch):
    import trainwise.launch.runs as train_run_module

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"status": "stopped", "steps": 7, "message":
                                                  "aborted by a second Ctrl-C during step 8"}))

    def aborted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_run_module, "train_run", aborted)
    monkeypatch.setattr(train_run_module, "resume_run", aborted)
    result = invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out), "--overwrite")
    assert result.returncode == 130 and "aborted by a second Ctrl-C" in result.stdout
    assert invoke(capsys, "resume", str(out)).returncode == 130


def test_train_help_documents_the_exit_codes(capsys):
    result = invoke(capsys, "train", "--help")
    assert "75" in result.stdout and "130" in result.stdout


def test_train_into_a_completed_run_suggests_overwrite_or_a_new_out_not_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out)).returncode == 0
    result = invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out))
    assert_refused(result, "completed", "--overwrite", "--out")
    assert "trainwise resume" not in result.stderr  # resume refuses a completed run
