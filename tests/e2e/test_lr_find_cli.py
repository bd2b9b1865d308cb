"""`trainwise lr-find` from the command line: the files and the override it prints; bad input exits 2 with
one line and writes nothing."""
from __future__ import annotations

import json

import torch

from tests.conftest import invoke
from trainwise.data.bundle import ArrayDataset, DataBundle, DataSpec
from trainwise.recipes import load_recipe

SMALL = ["model.args.hidden=[16]", "telemetry.enabled=false"]


def no_loss_data(seed: int):
    """A user's data factory whose task has no built-in loss (imported by `module:attr` below)."""
    x = torch.randn(64, 5, generator=torch.Generator().manual_seed(seed))
    return DataBundle(ArrayDataset(x, x), None, None, spec=DataSpec(input_shape=(5,), num_classes=None,
                                                                     task="embedding"))  # type: ignore[arg-type]


def test_lr_find_writes_the_curve_and_prints_an_override_train_accepts(capsys, wide_terminal, tmp_path):
    out = tmp_path / "lr"
    result = invoke(capsys, "lr-find", "breast-cancer", *SMALL, "--out", str(out), "--steps", "30", "--max-lr", "100")
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "lr_find.json").read_text())
    assert record["override"] in result.stdout and record["override"].startswith("optim.lr=")
    assert (out / "lr_find.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in out.iterdir()) == ["lr_find.json", "lr_find.png"]
    config = load_recipe("breast-cancer", [record["override"]])  # the printed override is one train takes
    assert config.optim.lr == float(record["override"].split("=")[1])


def _assert_refused(result, *words):
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error:")
    for word in words:
        assert word in result.stderr


def test_an_existing_out_dir_exits_2_and_is_left_alone(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = invoke(capsys, "lr-find", "breast-cancer", "--out", str(tmp_path))
    _assert_refused(result, "already holds files", "--overwrite")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_an_unknown_recipe_exits_2_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "lr"
    result = invoke(capsys, "lr-find", "no-such-recipe", "--out", str(out))
    _assert_refused(result, "no-such-recipe")
    assert not out.exists()


def test_a_recipe_without_a_loss_exits_2_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "lr"
    result = invoke(capsys, "lr-find", "breast-cancer", "data.factory=tests.e2e.test_lr_find_cli:no_loss_data",
                    "--out", str(out))
    _assert_refused(result, "needs a loss")
    assert not out.exists()


def test_bad_sweep_bounds_exit_2(capsys, tmp_path):
    result = invoke(capsys, "lr-find", "breast-cancer", "--out", str(tmp_path / "lr"), "--min-lr", "1",
                    "--max-lr", "0.1")
    _assert_refused(result, "--min-lr")
