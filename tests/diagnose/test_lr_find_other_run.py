"""`trainwise lr-find digits --out <a table run>` must not write a digits LR test into that run (issue 26)."""
import pytest

from trainwise.check import lr_find as finder
from trainwise.errors import RunDirError
from trainwise.recipes import load_recipe
from trainwise.rundir.layout import RunDir


def test_an_lr_test_of_another_recipe_is_refused_in_a_run_directory(tmp_path):
    run = RunDir.create(tmp_path / "bc")
    run.write_config(load_recipe("breast-cancer"))
    with pytest.raises(RunDirError, match="is a run of breast-cancer.*Nothing was touched"):
        finder.refuse_out_dir(run.path, overwrite=True, config=load_recipe("digits"))
    assert not any(p.exists() for p in run.lr_find_paths)
    finder.refuse_out_dir(run.path, overwrite=False, config=load_recipe("breast-cancer", ["optim.lr=0.1"]))
