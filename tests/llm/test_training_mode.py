"""A model loaded with from_pretrained (transformers returns it in eval mode) trains in training mode from its
first step, and validation leaves it so. Before, peft's wrapper was in training mode but the blocks inside it
were not: they ran without gradient checkpointing (and dropout) until the first validation pass restored the
wrapper's mode to every module, and every later step ran 40-50% slower (benchmarks/after_validation.py).
The same run records the attention implementation it chose, in config.yaml and in its `started` event."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.llm.conftest import tiny_model
from trainwise.config import config_from_dict
from trainwise.data.batch import IGNORE_INDEX
from trainwise.data.bundle import DataSpec
from trainwise.llm import hf
from trainwise.llm.methods import apply_model_config
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.base import Callback
from trainwise.train.loop.timing import StepTimer
from trainwise.train.loop.trainer import Trainer

SEQ = 16


def token_rows(count: int, vocab: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (SEQ,), generator=g)
        labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
        rows.append({"input_ids": ids, "labels": labels, "position_ids": torch.arange(SEQ)})
    return rows


class TrainingForwards(Callback):
    """Whether each training forward (gradients on) ran every decoder layer in training mode, per step."""

    def __init__(self, layers):
        self.by_step: dict[int, set[bool]] = {}
        self.step = 1
        for layer in layers:
            layer.register_forward_pre_hook(self._seen)

    def _seen(self, layer, args):
        if torch.is_grad_enabled():
            self.by_step.setdefault(self.step, set()).add(layer.training and layer.gradient_checkpointing)

    def on_step_end(self, trainer) -> None:
        self.step = trainer.step + 1


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Llama saved and loaded back with from_pretrained, LoRA + checkpointing, 4 steps validated at 2."""
    folder = tmp_path_factory.mktemp("pretrained")
    tiny_model("llama").save_pretrained(folder / "base")
    model = hf.load_pretrained(folder / "base")
    assert not model.training  # what transformers hands over
    config = config_from_dict({
        "seed": 0, "model": {"name": None, "method": "lora", "gradient_checkpointing": True},
        "data": {"name": "prepared", "num_workers": 0}, "optim": {"name": "adamw", "lr": 1e-3},
        "train": {"max_steps": 4, "batch_size": 4, "log_every": 1, "device": "cpu", "precision": "fp32",
                  "sanity": False},
        "eval": {"every_steps": 2, "every_epoch": False}, "telemetry": {"enabled": False}}, source="test")
    model = apply_model_config(model, config.model)
    forwards = TrainingForwards([m for m in model.modules() if type(m).__name__ == "LlamaDecoderLayer"])
    spec = DataSpec(input_shape=(SEQ,), num_classes=512, task="causal_lm", input_dtype=torch.long)
    run = RunDir.create(folder / "run")
    Trainer(model, token_rows(16, 512), token_rows(4, 512), config=config, data_spec=spec, run_dir=run,
            callbacks=[forwards]).fit()
    return forwards, run.path


def test_a_pretrained_lora_model_trains_with_checkpointing_before_and_after_validation(trained):
    forwards, _ = trained
    assert forwards.by_step == {step: {True} for step in range(1, 5)}  # steps 3-4 follow the validation at 2


def test_the_chosen_attention_is_recorded_in_config_yaml_and_the_started_event(trained):
    _, run = trained
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["attention"] == "sdpa"  # the CPU's choice
    started = next(e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
                   if e["kind"] == "started")
    assert started["evidence"]["attention"] == "sdpa"
    assert hf.attention_choices("cuda", "eager") == ("eager",)  # a recorded choice is what a resume builds


def test_the_log_interval_after_a_validation_pass_leaves_its_time_out(monkeypatch):
    clock = iter([0.0, 3.0, 13.0, 14.0])  # interval start, pause from 3 to 13 s, flush at 14
    monkeypatch.setattr("trainwise.train.loop.timing.time.perf_counter", lambda: next(clock))
    timer = StepTimer(torch.device("cpu"))
    timer.step_done(torch.tensor(1.0), samples=4)
    with timer.paused():
        pass
    timer.step_done(torch.tensor(1.0), samples=4)
    assert timer.flush()["step_time_s"] == 2.0  # (14 - 10 paused) / 2 steps
