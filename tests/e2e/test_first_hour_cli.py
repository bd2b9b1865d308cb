"""A user's first hour: `prepare` says what to run next, `data bench` is quick and recommends what it measured
best, with the numbers."""
from __future__ import annotations

import json
import shlex

import numpy as np
from PIL import Image

from tests.conftest import invoke


def _photos(root, per_class=20):
    rng = np.random.default_rng(0)
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(70 + 110 * c, 20, (24, 24, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def _table(path, rows=200):
    lines = ["x,kind,label"] + [f"{i % 7},{'ab'[i % 2]},{i % 3}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _next_command(stdout: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith("Next: trainwise train "))
    return shlex.split(line.removeprefix("Next: trainwise ").split(" (")[0])


def test_prepare_ends_with_a_train_command_whose_batch_fits_a_small_image_set(tmp_path, capsys):
    out = tmp_path / "prepared"
    result = invoke(capsys, "prepare", str(_photos(tmp_path / "photos")), "--to", str(out), "--size", "16",
                    "--workers", "1")
    assert result.returncode == 0, result.stderr
    command = _next_command(result.stdout)
    assert command[:3] == ["train", "image-folder", f"data.path={out}"] and "--out" in command
    batch = int(next(arg for arg in command if arg.startswith("train.batch_size=")).split("=")[1])
    train_count = json.loads((out / "manifest.json").read_text())["splits"]["train"]["count"]
    assert batch < 128 and train_count // batch >= 4  # the recipe's 128 would not fill one batch
    # the suggestion runs as printed
    run = tmp_path / "run"
    command[command.index("--out") + 1] = str(run)
    trained = invoke(capsys, *command, "train.epochs=1", "telemetry.enabled=false")
    assert trained.returncode == 0, trained.stderr
    # asked again, an up-to-date dataset still says what comes next
    again = invoke(capsys, "prepare", str(tmp_path / "photos"), "--to", str(out), "--size", "16")
    assert "up to date" in again.stdout and _next_command(again.stdout) == _next_command(result.stdout)


def test_prepare_of_a_table_keeps_the_recipe_batch_when_the_set_holds_it(tmp_path, capsys):
    out = tmp_path / "t"
    result = invoke(capsys, "prepare", str(_table(tmp_path / "t.csv", rows=2000)), "--to", str(out))
    assert result.returncode == 0, result.stderr
    assert _next_command(result.stdout) == ["train", "table", f"data.path={out}", "--out", "runs/t"]


def test_data_bench_is_quick_by_default_and_recommends_the_fastest_setting(tmp_path, capsys):
    from trainwise.data.bench import worker_counts

    out = tmp_path / "t"
    assert invoke(capsys, "prepare", str(_table(tmp_path / "t.csv")), "--to", str(out)).returncode == 0
    result = invoke(capsys, "data", "bench", str(out), "--device", "cpu", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    rates = data["loader_samples_per_s"]
    assert list(rates) == [str(c) for c in worker_counts(quick=True)] and len(rates) <= 3
    assert rates[data["recommended_num_workers"]] >= 0.95 * max(rates.values())
    assert f"{rates[data['recommended_num_workers']]:,.0f} samples/s" in data["message"]
    table = invoke(capsys, "data", "bench", str(out), "--device", "cpu", "--workers", "0", "--seconds", "0.1")
    assert "num_workers=0 loaded the most" in " ".join(table.stdout.split())
    assert invoke(capsys, "data", "bench", str(out), "--seconds", "0").returncode == 2


def _commands():
    import typer

    from trainwise.cli import app

    def walk(command, path):
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            yield path
            return
        for name, sub in subcommands.items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


READ_COMMANDS = [["recipes"], ["plan"], ["doctor"], ["monitor"], ["explain"], ["diagnose"], ["eval"], ["compare"],
                 ["data", "verify"], ["data", "bench"]]


def test_help_shows_flags_as_flags_and_every_read_command_has_json():
    from typer.testing import CliRunner

    from trainwise.cli import app

    commands = _commands()
    assert all(read in commands for read in READ_COMMANDS), commands
    for command in [[], *commands]:
        shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (command, shown.output)
        assert "<bool>" not in shown.output, (command, shown.output)  # `--json <bool>` reads as taking a value
        if command in READ_COMMANDS:
            assert "--json" in shown.output, command


def test_data_verify_json_for_a_sound_and_a_damaged_dataset(tmp_path, capsys):
    out = tmp_path / "t"
    assert invoke(capsys, "prepare", str(_table(tmp_path / "t.csv")), "--to", str(out)).returncode == 0
    sound = invoke(capsys, "data", "verify", str(out), "--json")
    assert sound.returncode == 0, sound.stderr
    report = json.loads(sound.stdout)
    assert report["ok"] and report["files"] > 0 and report["damaged"] == []
    manifest = json.loads((out / "manifest.json").read_text())
    shard = out / manifest["splits"]["train"]["shards"][0]["files"]["inputs"]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    damaged = invoke(capsys, "data", "verify", str(out), "--json")
    assert damaged.returncode == 2 and "damaged" in damaged.stderr
    report = json.loads(damaged.stdout)
    assert not report["ok"] and report["damaged"][0]["file"].endswith(shard.name)


def test_recipes_json_lists_the_built_in_recipes(capsys):
    listed = invoke(capsys, "recipes", "--json")
    assert listed.returncode == 0
    assert {"digits", "breast-cancer", "table", "image-folder"} <= set(json.loads(listed.stdout))


def test_compare_refuses_a_single_run_and_says_what_to_use_instead(tmp_path, capsys):
    result = invoke(capsys, "compare", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "two or more run directories" in result.stderr and f"trainwise eval {tmp_path / 'run'}" in result.stderr


def test_data_bench_quick_default_times_few_model_steps_and_full_times_more(tmp_path, capsys, monkeypatch):
    import trainwise.data.bench as data_bench
    import trainwise.check.throughput as throughput

    out = tmp_path / "t"
    assert invoke(capsys, "prepare", str(_table(tmp_path / "t.csv")), "--to", str(out)).returncode == 0
    asked = []
    monkeypatch.setattr(throughput, "model_rate", lambda *a, steps, warmup, **k: asked.append((steps, warmup)) or 1.0)
    timed = []
    monkeypatch.setattr(data_bench, "loader_rate", lambda *a, seconds, **k: timed.append(seconds) or 100.0)
    assert invoke(capsys, "data", "bench", str(out)).returncode == 0
    assert asked == [(1, 1)] and set(timed) == {data_bench.QUICK_SECONDS} and len(timed) <= 3
    asked.clear()
    timed.clear()
    assert invoke(capsys, "data", "bench", str(out), "--full").returncode == 0
    assert asked == [(8, 2)] and set(timed) == {data_bench.FULL_SECONDS}
    assert len(timed) == len(data_bench.worker_counts())


def test_an_early_stop_says_why_in_the_console_and_the_report_header_not_completed(tmp_path, capsys):
    """Issue 15: early stopping ended with "completed after 285 steps" and a report header that did not say
    why. Now the console's headline and the report's header both say where it stopped, why, and which step's
    weights were restored."""
    out = tmp_path / "run"
    # an lr of 1e-9 keeps val/loss flat, so two evaluations without improvement stop it
    trained = invoke(capsys, "train", "breast-cancer", "optim.lr=1e-9", "train.max_steps=200", "train.log_every=10",
                     "eval.every_steps=10", "eval.every_epoch=false", "eval.early_stopping.patience=2",
                     "telemetry.enabled=false", "--out", str(out))
    assert trained.returncode == 0, trained.stderr
    said = " ".join(trained.stdout.split())
    summary = json.loads((out / "summary.json").read_text())
    steps, best = summary["steps"], summary["best"]["step"]
    why = (f"stopped early at step {steps} of 200 (val/loss did not improve for 2 evaluations); "
           f"best step {best} restored")
    assert steps < 200 and said.startswith(why) and "completed after" not in said
    assert invoke(capsys, "report", str(out), "--format", "md").returncode == 0
    header = (out / "report.md").read_text().split("## ")[0]
    assert why in header


def test_an_out_that_cannot_be_written_is_the_one_thing_said(capsys):
    """Issue 17 §7: `--out /proc/foo` was preceded by a warning that /proc has "0.0 MiB free" for the
    checkpoints, which sent the user after disk space; the run directory's own error comes alone."""
    result = invoke(capsys, "train", "breast-cancer", "telemetry.enabled=false", "--out", "/proc/trainwise-first-hour")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: --out /proc/trainwise-first-hour: cannot write the run directory there")
    assert "MiB free" not in result.stderr


def test_a_reader_that_goes_away_does_not_kill_the_run(tmp_path):
    """`trainwise train ... | head -1`: once the pipe closes the run goes on silently, it is not failed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    out = tmp_path / "run"
    command = (f"{shlex.quote(sys.executable)} -m trainwise train breast-cancer --out {shlex.quote(str(out))} "
               "train.max_steps=40 train.log_every=1 eval.every_steps=20 telemetry.enabled=false 2>&1 | head -1")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(src)})
    assert done.stdout.startswith("training 40 steps")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] >= 20, summary
