"""The progress line (issue 35): it fits 80 columns, piped output never wraps, the ETA comes from a smoothed
pace that ignores the warm-up steps, and the start line says the dtype the weights train in."""
from __future__ import annotations

import io

import torch
from rich.console import Console

from trainwise.rundir import RunDir
from trainwise.train.loop.progress import ProgressDisplay, StepPace, _describe, duration, precision_words

WORST = {"loss": 10.123456, "lr": 1.2345e-4, "samples_per_s": 1234.0, "tokens_per_s": 1_234_567.0, "mfu": 0.456,
         "data_wait_fraction": 0.99}


class FakeTrainer:
    step, max_steps, epoch, device, precision = 0, 100_000, 0, "cpu", "fp32"
    run_dir = RunDir("runs/x")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_piped_line_fits_80_columns_and_keeps_the_step_loss_and_eta(tmp_path):
    out = io.StringIO()
    clock = Clock()
    display = ProgressDisplay(Console(file=out, force_terminal=False, width=80), clock=clock)
    trainer = FakeTrainer()
    display.on_fit_start(trainer)
    for step in range(1, 99_999 + 1, 11_111):
        trainer.step, clock.now = step, clock.now + 100.0
        display.on_step_end(trainer)
        display.on_log(trainer, WORST)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("step ")]
    assert lines and all(len(line) <= 80 for line in lines), lines
    assert all("loss 10.1235" in line and " eta " in line for line in lines), lines
    assert "MFU: no peak" not in out.getvalue()


def test_the_figures_with_no_value_are_left_out():
    quiet = {"loss": 2.0, "lr": 1e-3, "samples_per_s": 900.0, "tokens_per_s": 149_225.0, "data_wait_fraction": 0.01}
    assert _describe(quiet) == "loss 2.0000  lr 1.00e-03  149k tokens/s"
    assert _describe({**quiet, "data_wait_fraction": 0.3}).endswith("data wait 30%")
    assert _describe(WORST, width=30) == "loss 10.1235  1.2M tokens/s"  # the least telling go first


def test_the_eta_is_smoothed_and_ignores_the_warm_up_steps():
    clock = Clock()
    pace = StepPace(clock, warmup=3, smoothing=0.1)
    pace.start()
    for took in (60.0, 30.0, 20.0):  # compilation and start-up: not the pace
        clock.now += took
        pace.step()
    assert pace.eta(100) is None
    etas = []
    for took in [2.0, 2.2, 1.8] * 10 + [40.0] + [2.0] * 5:  # one evaluation among steady steps
        clock.now += took
        pace.step()
        etas.append(pace.eta(100))
    assert all(180 <= eta <= 220 for eta in etas[:30]), etas[:30]  # steady within 10% of 200 s
    assert max(etas[30:]) < 1.4 * 200  # the slow step moves it a little, never 20 times
    assert duration(90) == "90s" and duration(754) == "12m34s" and duration(4140) == "1h09m"


def test_the_terminal_eta_follows_the_smoothed_pace():
    out = io.StringIO()
    clock = Clock()
    display = ProgressDisplay(Console(file=out, force_terminal=False, width=120), clock=clock)
    trainer = FakeTrainer()
    trainer.max_steps = 50
    display.on_fit_start(trainer)
    for step in range(1, 21):
        trainer.step = step
        clock.now += 30.0 if step <= 3 else (20.0 if step % 2 else 47.0)  # steps of 20-47 s, as in issue 35
        display.on_step_end(trainer)
    display.on_log(trainer, {"loss": 1.0, "lr": 1e-3, "samples_per_s": 1.0, "data_wait_fraction": 0.0})
    eta_minutes = int(out.getvalue().split("eta ")[-1].split("m")[0])
    assert 13 <= eta_minutes <= 23  # 30 steps left at about 33.5 s each: about 17 minutes


def test_the_start_line_says_the_dtype_the_weights_train_in():
    trainer = FakeTrainer()
    trainer.model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    assert precision_words(trainer) == "bf16 weights"
    trainer.model.bias.data = trainer.model.bias.data.float()  # a trainable fp32 part beside a bf16 bulk
    trainer.model.weight.requires_grad_(False)
    assert precision_words(trainer) == "bf16 weights, trainable in fp32"
    trainer.model = torch.nn.Linear(4, 4)
    trainer.precision = "bf16"
    assert precision_words(trainer) == "bf16"  # fp32 weights under bf16 autocast, as before


def test_the_bar_line_at_80_columns_keeps_the_step_bar_loss_lr_and_eta():
    import re

    out = io.StringIO()
    display = ProgressDisplay(Console(file=out, force_terminal=True, width=80), clock=Clock())
    trainer = FakeTrainer()
    trainer.max_steps = 2000
    display.on_fit_start(trainer)
    trainer.step = 1950
    display.on_step_end(trainer)
    display.on_log(trainer, {"loss": 1.6021, "lr": 1e-4, "samples_per_s": 2e3, "tokens_per_s": 149_225.0,
                             "data_wait_fraction": 0.0})
    display.progress.refresh()
    display.progress.stop()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).split("\r")[-1].strip()
    assert len(shown) <= 80 and shown.startswith("step 1950/2000 ━"), shown
    assert "loss 1.6021  lr 1.00e-04  149k tokens/s" in shown and "eta" in shown, shown
