"""Every checkpoint records the config it was trained with; `resume` refuses another config.yaml, naming the
changed fields, and `--allow-config-change` accepts only the changes that are safe mid-run."""
import json

import pytest
import yaml

from tests.conftest import invoke, stop_at, tiny_config
from trainwise.config.diff import config_hash, diff_configs, is_safe_to_change
from trainwise.errors import ConfigError
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import read_checkpoint
from trainwise.launch.resolve import resolve_run
from trainwise.launch.runs import resume_run, train_run


@pytest.fixture
def stopped_run(tmp_path):
    """A run stopped (as by a signal) at step 10 of 30, checkpointed there."""
    config = tiny_config(train={"sanity": False})
    run = train_run(config, tmp_path / "run", callbacks=[stop_at(10)])
    assert run.read_summary()["status"] == "stopped"
    return run, resolve_run(config).config  # what it trained with: its `auto` settings decided (launch/resolve.py)


def _edit_config(run: RunDir, **changes: object) -> None:
    raw = yaml.safe_load(run.config_path.read_text())
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    run.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))


def test_a_checkpoint_records_its_config_and_hash(stopped_run):
    run, config = stopped_run
    state = read_checkpoint(run.checkpoint_path("last"))
    assert state["config"] == config.model_dump(mode="json")
    assert state["config_hash"] == config_hash(config) == config_hash(run.read_config())


def test_an_edited_batch_size_is_refused_by_name(stopped_run):
    run, _ = stopped_run
    _edit_config(run, train__batch_size=16)
    with pytest.raises(ConfigError, match=r"train\.batch_size: 32 → 16") as refused:
        resume_run(run.path)
    assert "--allow-config-change" not in str(refused.value).split("Restore")[0].splitlines()[-1]
    with pytest.raises(ConfigError, match=r"train\.batch_size: 32 → 16"):  # the flag does not make it safe
        resume_run(run.path, allow_config_change=True)
    assert run.read_summary()["status"] == "stopped" and run.read_summary()["steps"] == 10


def test_a_truncated_config_is_refused_naming_what_went_back_to_defaults(stopped_run):
    run, _ = stopped_run
    run.config_path.write_bytes(run.config_path.read_bytes()[:300])
    with pytest.raises(ConfigError) as refused:
        resume_run(run.path)
    message = str(refused.value)
    # a cut mid-line is no YAML; a cut between lines leaves sections back at their defaults (next test)
    assert "config.yaml" in message and ("not valid YAML" in message or "invalid configuration" in message
                                         or "→" in message), message
    assert run.read_summary()["status"] == "stopped"


def test_a_config_cut_after_its_sections_is_refused_field_by_field(stopped_run):
    run, _ = stopped_run
    text = run.config_path.read_text()
    run.config_path.write_text(text[:text.index("\ntrain:")] + "\n")  # the train: and later sections are gone
    with pytest.raises(ConfigError) as refused:
        resume_run(run.path)
    message = str(refused.value)
    assert "train.max_steps: 30 → 100 (missing from config.yaml" in message
    assert "eval.every_steps: 10 → null" in message and "telemetry.enabled: false → true" in message
    # every one of them may be changed on purpose, but a field missing from config.yaml is damage, not a choice
    with pytest.raises(ConfigError, match=r"train\.max_steps: 30 → 100 \(missing(.|\n)*cut short"):
        resume_run(run.path, allow_config_change=True)
    assert run.read_summary()["status"] == "stopped"


def test_max_steps_raised_needs_the_flag_then_resumes_to_the_new_end(stopped_run):
    run, _ = stopped_run
    _edit_config(run, train__max_steps=40)
    with pytest.raises(ConfigError, match=r"train\.max_steps: 30 → 40(.|\n)*--allow-config-change"):
        resume_run(run.path)
    with pytest.warns(Warning, match="train.max_steps: 30 → 40"):
        resume_run(run.path, allow_config_change=True)
    summary = run.read_summary()
    assert summary["status"] == "completed" and summary["steps"] == 40
    changed = [e for e in run.read_events() if e["kind"] == "config_changed"]
    assert changed and changed[0]["evidence"]["changes"] == [{"field": "train.max_steps", "old": 30, "new": 40}]
    # the LR schedule follows the new length: the steps past the old end still learn (cosine to 0 at 30)
    lrs = {r["step"]: r["lr"] for r in run.read_metrics("train")}
    assert lrs[35] > 0
    # and the checkpoints written since record the new config: a second resume compares with it
    assert read_checkpoint(run.checkpoint_path("last"))["config"]["train"]["max_steps"] == 40


def test_an_unsafe_change_is_refused_even_with_the_flag(stopped_run):
    run, _ = stopped_run
    _edit_config(run, train__max_steps=40, optim__lr=0.1)
    with pytest.raises(ConfigError) as refused:
        resume_run(run.path, allow_config_change=True)
    message = str(refused.value)
    assert "optim.lr: 0.003 → 0.1" in message and "train.max_steps" not in message.split("Restore")[0]


def test_max_steps_lowered_below_the_checkpoint_is_refused(stopped_run):
    run, _ = stopped_run
    _edit_config(run, train__max_steps=8)
    with pytest.raises(ConfigError, match="step 10"):
        resume_run(run.path, allow_config_change=True)


def test_a_checkpoint_from_before_config_hashes_resumes_with_a_note(tmp_path, monkeypatch):
    import trainwise.train.recovery.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "config_record", lambda config: {})
    run = train_run(tiny_config(train={"sanity": False}), tmp_path / "run", callbacks=[stop_at(10)])
    monkeypatch.undo()
    assert "config" not in read_checkpoint(run.checkpoint_path("last"))
    with pytest.warns(Warning, match="does not record the config"):
        resume_run(run.path)
    assert run.read_summary()["status"] == "completed"
    assert any(e["kind"] == "config_unchecked" for e in run.read_events())


def test_the_cli_refuses_with_exit_2_and_no_traceback(stopped_run, capsys):
    run, _ = stopped_run
    _edit_config(run, train__batch_size=16)
    result = invoke(capsys, "resume", str(run.path))
    assert result.returncode == 2
    assert "train.batch_size: 32 → 16" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    _edit_config(run, train__batch_size=32, train__max_steps=40)
    result = invoke(capsys, "resume", str(run.path), "--allow-config-change")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(run.summary_path.read_text())["steps"] == 40


def test_diff_names_nested_fields_and_the_allow_list_is_narrow():
    old = {"train": {"batch_size": 64, "max_steps": 10}, "telemetry": {"interval_s": 2.0}, "model": {"args": {}}}
    new = {"train": {"batch_size": 32, "max_steps": 10}, "telemetry": {"interval_s": 5.0},
           "model": {"args": {"hidden": [8]}}}
    assert [str(c) for c in diff_configs(old, new)] == [
        "train.batch_size: 64 → 32", "telemetry.interval_s: 2.0 → 5.0", "model.args.hidden: (absent) → [8]"]
    assert is_safe_to_change("train.max_steps") and is_safe_to_change("telemetry.interval_s")
    assert not any(map(is_safe_to_change, ["train.batch_size", "optim.lr", "eval.monitor", "model.args.hidden",
                                           "train.precision", "seed", "data.name"]))


def test_a_sharded_checkpoint_records_its_config_and_resume_compares_it(tmp_path):
    config = tiny_config(train={"sanity": False, "strategy": "fsdp"})
    run = train_run(config, tmp_path / "run", callbacks=[stop_at(10)])
    state = read_checkpoint(run.checkpoint_dirs.state_path(run.checkpoint_dirs.pointer("last")))
    assert state["config_hash"] == config_hash(resolve_run(config).config)
    _edit_config(run, train__batch_size=16)
    with pytest.raises(ConfigError, match=r"train\.batch_size: 32 → 16"):
        resume_run(run.path)
    _edit_config(run, train__batch_size=32, train__max_steps=40)
    with pytest.warns(Warning, match="train.max_steps: 30 → 40"):
        resume_run(run.path, allow_config_change=True)
    assert run.read_summary()["steps"] == 40


def test_a_field_newer_than_the_checkpoint_and_config_yaml_is_no_change():
    from trainwise.config.diff import check_resume_config

    config = tiny_config()
    stored = config.model_dump(mode="json")
    written = config.model_dump(mode="json")
    del stored["train"]["dist_timeout_s"], written["train"]["dist_timeout_s"]  # as written by an older trainwise
    assert check_resume_config(stored, config, allow_change=False, checkpoint="last.pt", step=10,
                               written=written) == []


def test_a_shorter_run_on_resume_keeps_the_lr_continuous(stopped_run):
    """Issue 35: 2,000 -> 600 steps at step 350 made the cosine LR jump from 9.76e-4 to 5.50e-4. The rest of the
    decay is re-fitted from the LR at the checkpoint's step instead, and the warning says so."""
    run, _ = stopped_run
    before = {r["step"]: r["lr"] for r in run.read_metrics("train") if r["step"] <= 10}
    _edit_config(run, train__max_steps=16, train__log_every=1)
    with pytest.warns(Warning, match="re-fitted, not re-shaped: from step 10"):
        resume_run(run.path, allow_config_change=True)
    lrs = {r["step"]: r["lr"] for r in run.read_metrics("train")}
    assert run.read_summary()["steps"] == 16
    after = [lrs[step] for step in range(10, 17)]
    assert after[0] == pytest.approx(before[10]) and all(a >= b for a, b in zip(after, after[1:])), lrs
    # one step on, the re-fitted cosine (6 steps left) is at 78% of where it was; re-shaped to 16 steps it
    # would have dropped to 30% at once
    assert lrs[11] > 0.7 * before[10] and lrs[16] == pytest.approx(0.0, abs=1e-12)
