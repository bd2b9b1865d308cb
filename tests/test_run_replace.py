"""`--overwrite` replaces an earlier run and nothing else (issue 28): the user's files, the working directory,
the data being trained on and the recipe file are never deleted; an old run is moved aside before it goes."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainwise.rundir import replace as run_replace
from trainwise.errors import RunDirError
from trainwise.rundir.layout import RunDir
from tests.conftest import assert_refused, invoke

FAST = ["train.max_steps=3", "schedule.warmup_steps=0", "train.sanity=false", "telemetry.enabled=false"]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _earlier_run(path: Path) -> RunDir:
    run = RunDir.create(path)
    run.log_metrics({"step": 1, "split": "train", "loss": 1.0})
    run.write_summary({"status": "completed", "steps": 1})
    run.release_writer()
    return run


def test_a_folder_of_the_users_files_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.txt").write_text("four years")
    assert_refused(invoke(capsys, "train", "breast-cancer", *FAST, "--out", str(out), "--overwrite"),
             "not a trainwise run", "thesis.txt", "Nothing was touched")
    assert (out / "thesis.txt").read_text() == "four years"


def test_the_working_directory_is_never_replaced(tmp_path, capsys, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('mine')")
    (project / "data.csv").write_text("a,b\n1,2\n")
    monkeypatch.chdir(project)
    assert_refused(invoke(capsys, "train", "breast-cancer", *FAST, "--out", ".", "--overwrite"), "the current directory")
    assert_refused(invoke(capsys, "train", "breast-cancer", *FAST, "--out", "..", "--overwrite"),
             "a parent of the current directory")
    assert (project / "train.py").is_file() and (project / "data.csv").is_file()


def test_a_run_in_the_working_directory_is_still_not_replaced(tmp_path, monkeypatch):
    _earlier_run(tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(RunDirError, match="the current directory"):
        RunDir.create(".", overwrite=True)
    assert (tmp_path / "run" / "summary.json").is_file()


def test_home_and_root_are_never_replaced(tmp_path, monkeypatch):
    assert run_replace.protected_place(Path("/")) == "a filesystem root"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert run_replace.protected_place(tmp_path) == "your home directory"


def test_the_prepared_dataset_being_trained_on_is_never_replaced(tmp_path, capsys):
    from trainwise.data.prepare import prepare

    csv = tmp_path / "table.csv"
    csv.write_text("x,y,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in range(60)))
    good = tmp_path / "out" / "good"
    prepare(csv, good)
    before = _tree(good)
    assert_refused(invoke(capsys, "train", "breast-cancer", *FAST, f"data.path={good}", "--out", str(good), "--overwrite"),
             "prepared dataset")
    assert _tree(good) == before


def test_a_folder_around_the_data_or_the_recipe_is_never_replaced(tmp_path):
    data = tmp_path / "runs" / "r1" / "data"
    data.mkdir(parents=True)
    recipe = tmp_path / "runs" / "r2" / "recipe.yaml"
    recipe.parent.mkdir()
    recipe.write_text("model: {name: mlp}\n")
    for out, given in ((tmp_path / "runs" / "r1", data), (data / "inner", data), (recipe.parent, recipe)):
        assert "this run's input" in run_replace.protected_place(out, [given])


def test_an_earlier_run_is_replaced_after_being_moved_aside(tmp_path, monkeypatch):
    old = _earlier_run(tmp_path / "run")
    moved: list[Path] = []
    real_move = run_replace.move_aside

    def spy(path: Path) -> Path:
        aside = real_move(path)
        moved.append(aside)
        assert (aside / "summary.json").is_file() and not path.exists()  # the old run is whole, beside
        return aside

    monkeypatch.setattr(run_replace, "move_aside", spy)
    new = RunDir.create(old.path, overwrite=True)
    assert new.read_metrics() == [] and not new.summary_path.exists()
    assert moved and not moved[0].exists()  # deleted only after the new directory exists
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_crash_between_moving_aside_and_deleting_loses_neither(tmp_path, monkeypatch):
    old = _earlier_run(tmp_path / "run")

    def crash(aside: Path):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_replace, "remove_aside", crash)
    with pytest.raises(KeyboardInterrupt):
        RunDir.create(old.path, overwrite=True)
    asides = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(asides) == 1 and (asides[0] / "summary.json").is_file()
    assert (tmp_path / "run").is_dir()


def test_a_lone_config_yaml_that_trainwise_did_not_write_is_not_a_run(tmp_path):
    out = tmp_path / "project"
    out.mkdir()
    (out / "config.yaml").write_text("model: resnet\nlr: 0.1\n")
    with pytest.raises(RunDirError, match="not a trainwise run"):
        RunDir.create(out, overwrite=True)
    assert (out / "config.yaml").read_text() == "model: resnet\nlr: 0.1\n"


_RUN_NAMES = sorted(RunDir.entry_names() - {".lock"})
_OTHER_NAMES = ["thesis.txt", "train.py", "data", "manifest.json", "notes.md", ".git", "config.yml", "README"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(_RUN_NAMES + _OTHER_NAMES), min_size=1, max_size=6, unique=True),
       nested=st.booleans())
def test_no_file_that_is_not_a_runs_is_ever_deleted(tmp_path_factory, names, nested):
    """Random folder contents: --overwrite either refuses (everything kept) or replaces a run's files only."""
    out = tmp_path_factory.mktemp("fuzz") / "out"
    out.mkdir()
    for name in names:
        target = out / name / "inner.bin" if nested or name in ("checkpoints", "eval", "data", ".git") else out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(os.urandom(8))
    before = _tree(out)
    try:
        RunDir.create(out, overwrite=True).release_writer()
    except RunDirError:
        assert _tree(out) == before
        return
    lost = {path for path in before if path not in _tree(out)}
    assert all(Path(path).parts[0] in RunDir.entry_names() for path in lost), lost
    assert not any(name in _OTHER_NAMES for name in names)
