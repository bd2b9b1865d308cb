"""Shared test helpers: small configs that train in a second or two on a CPU."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from trainwise.config import RunConfig, config_from_dict

ROOT = Path(__file__).resolve().parents[1]


# ---- the suite over several workers (`make test`: pytest-xdist, --dist loadscope) ----------------------------
def pytest_configure(config):
    """Each xdist worker gets its share of the cores. Left alone, torch in every worker (and in every
    subprocess it starts) runs one thread per core: on 2 cores, 2 workers ran 4 spinning threads, and a matmul
    took 4x as long with 2 threads as with 1 whenever the cores were busy. A user's OMP_NUM_THREADS is kept.

    In the controller: scopes are handed out in the order collected (see pytest_collection_modifyitems), not
    xdist's default of most tests first, which sent the one-test modules that take minutes (a real model, the
    2-rank loops) last, so that one worker ran them while the other had nothing left."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // workers))  # read by torch at import, and by subprocesses
        if "torch" in sys.modules:  # imported already (by a plugin): told directly
            sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if getattr(config.option, "dist", "no") == "loadscope":
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Modules that hold a slow test first (in their collected order), the quick ones after them: the long
    scopes start while the other worker has work, and the many short ones even out the end. A module's tests
    stay together, so its module fixtures are made once."""
    slow_modules = {getattr(item, "module", None) for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: getattr(item, "module", None) not in slow_modules)  # stable: the collected order otherwise


def tiny_config(**sections) -> RunConfig:
    """breast-cancer MLP, a few dozen steps, no telemetry thread; sections override by merge."""
    raw = {
        "seed": 0,
        "model": {"name": "mlp", "args": {"hidden": [16], "dropout": 0.0}},
        "data": {"name": "breast_cancer", "val_fraction": 0.15, "test_fraction": 0.15},
        "optim": {"name": "adamw", "lr": 0.003},
        "train": {"max_steps": 30, "batch_size": 32, "log_every": 5},
        "eval": {"every_steps": 10},
        "telemetry": {"enabled": False},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values} if isinstance(values, dict) else values
    return config_from_dict(raw, source="test")


def train_until_killed(args: list[str], out: Path, reached, env: dict | None = None) -> None:
    """`trainwise train ARGS --out OUT` in a process of its own, SIGKILLed once `reached()` (or after 120 s,
    or when it ended by itself)."""
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    with subprocess.Popen([sys.executable, "-m", "trainwise", "train", *args, "--out", str(out)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.time() + 120
        while not reached() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)


def straight_and_killed(capsys, args: list[str], tmp_path: Path, progress, window: range) -> tuple[Path, Path, int]:
    """The setup of the SIGKILL-then-resume tests: `train ARGS` straight through in this process, and in a
    process of its own SIGKILLed once `progress(run)` reaches the start of `window`; both on one thread, so
    their arithmetic is the same. Returns (straight, killed, the progress at the kill), checked to be in
    `window` (mid-run)."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert invoke(capsys, "train", *args, "--out", str(straight)).returncode == 0
    train_until_killed(args, killed, lambda: progress(killed) >= window.start, env=ONE_THREAD)
    at = progress(killed)
    assert at in window, f"the kill should land mid-run ({window.start} to {window.stop - 1}), it landed at {at}"
    return straight, killed, at


def start_torchrun(*args: str, nproc: int = 2, **popen) -> subprocess.Popen:
    """`python -m torch.distributed.run --nproc_per_node=NPROC -m trainwise ARGS` on the CPU, in a session of its
    own (so a hang can end the whole job), stdout and stderr together."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc_per_node={nproc}", "-m", "trainwise", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **popen)


def finish_job(proc: subprocess.Popen, timeout: float = 150) -> tuple[int, str]:
    """(exit code, output) of a started job; a job still running after `timeout` is killed and fails the test."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # a hang: end the whole job (its own session), then fail
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"the job still ran after {timeout} s:\n{output[-3000:]}") from None
    return proc.returncode, output


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None):
    """`python -m trainwise ARGS` in a subprocess; returns the CompletedProcess (never raises)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "trainwise", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def wide_terminal(monkeypatch):
    """The 200 columns run_cli gives its subprocess, for `invoke` in this one: Rich wraps nothing."""
    monkeypatch.setenv("COLUMNS", "200")


ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # a subprocess's share of the tiny models' CPU, as `one_thread` is in process


@pytest.fixture
def one_thread():
    """Tiny models on a shared CPU: threads only fight over the cores. A test that compares bits between this
    process and a subprocess pins both to one thread (the subprocess with ONE_THREAD)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class CliResult:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def invoke(capsys, *args: str, show_warnings: bool = False) -> CliResult:
    """Run the CLI in this process (no interpreter start-up): exit code, stdout, stderr. pytest records the
    warnings a test raises; `show_warnings` prints them on stderr instead, where the CLI's user sees them."""
    import warnings

    from trainwise.cli import main

    capsys.readouterr()
    argv = sys.argv
    sys.argv = ["trainwise", *args]
    code = 0
    try:
        with warnings.catch_warnings():
            if show_warnings:
                warnings.simplefilter("default")  # a fresh interpreter's filter for them: each place once
                warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
                    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 3 MiB tmpfs (needs root and permission to mount; skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / f"tiny-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def stop_at(step: int):
    """A callback that asks the trainer to stop after `step`, as a signal would (checkpoint, status stopped)."""
    from trainwise.train.callbacks.base import Callback

    class StopAt(Callback):
        def on_step_end(self, trainer):
            if trainer.step == step:
                trainer.request_stop("signal:test")

    return StopAt()


def assert_refused(result, *phrases):
    """A bad input: exit 2, no traceback, and a message that says each of `phrases`."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, f"{phrase!r} not in:\n{result.stderr}"
