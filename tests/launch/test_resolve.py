"""The one resolve step (launch/resolve.py): what a config leaves `auto` or unset is decided before the Trainer
is built, the same for `trainwise train`, `demo` and Python callers of `train_run`, and config.yaml records it."""
from __future__ import annotations

import pytest
import torch
import yaml

from tests.conftest import stop_at, tiny_config
from tests.data.text.test_prepare_text import make_corpus
from trainwise.config.derived import (DEFAULT_TEXT_SEQ_LEN, micro_batch_at_most, micro_batch_sizes,
                                      text_sequence_length)
from trainwise.data.prepare import PrepareOptions
from trainwise.launch import resolve
from trainwise.launch.resolve import EVENT_KIND, resolve_run
from trainwise.launch.runs import resume_run, train_run
from trainwise.recipes import load_recipe
from trainwise.data.prepare import prepare_corpus
from trainwise.data.text.tokenizer import recorded_sequence_length

CPU = {"device": "cpu", "sanity": False, "log_every": 2}


def _recorded(run) -> dict:
    return yaml.safe_load(run.config_path.read_text())


def test_a_python_train_run_resolves_every_auto_and_config_yaml_records_the_numbers(tmp_path):
    config = tiny_config(train={**CPU, "micro_batch_size": "auto", "max_steps": 4, "batch_size": 16},
                         eval={"every_steps": None, "every_epoch": False})
    run = train_run(config, tmp_path / "run")  # no resolver handed in: launch/ owns the step
    assert run.read_summary()["status"] == "completed"
    train = _recorded(run)["train"]
    assert isinstance(train["micro_batch_size"], int) and 16 % train["micro_batch_size"] == 0
    assert (train["precision"], train["strategy"]) == ("fp32", "single")
    [event] = [e for e in run.read_events() if e["kind"] == EVENT_KIND]
    assert set(event["evidence"]) == {"train.precision", "train.strategy", "train.micro_batch_size"}
    assert "train.strategy=single (one process)" in event["message"]
    assert [e["kind"] for e in run.read_events()].count("micro_batch_auto") == 1


def test_a_resume_keeps_the_recorded_values(tmp_path):
    config = tiny_config(train={**CPU, "micro_batch_size": "auto", "max_steps": 8})
    run = train_run(config, tmp_path / "run", callbacks=[stop_at(4)])
    before = _recorded(run)
    resume_run(run.path)  # the checkpoint's config is the resolved one: nothing differs, nothing is refused
    assert run.read_summary()["status"] == "completed" and _recorded(run) == before
    assert [e["kind"] for e in run.read_events()].count(EVENT_KIND) == 1


@pytest.fixture(scope="module")
def prepared_text(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    prepared = prepare_corpus(make_corpus(root / "corpus", documents=16), root / "data", PrepareOptions())
    return root / "data", prepared.manifest["lengths"]["suggested_seq_len"]


def test_a_text_run_without_seq_len_trains_at_the_suggested_length_and_records_it(prepared_text, tmp_path):
    data, suggested = prepared_text
    config = load_recipe("lm-gpt", ["model.args.layers=1", "model.args.width=16", "model.args.heads=2",
                                    "train.max_steps=2", "train.batch_size=2", "eval.every_steps=2",
                                    "schedule.warmup_steps=1", "telemetry.enabled=false", "train.sanity=false",
                                    "train.device=cpu", f"data.path={data}", "data.seq_len=null"])
    assert config.data.seq_len is None and suggested != 64  # not the recipe's own 64
    assert resolve_run(config).config.data.seq_len == suggested
    run = train_run(config, tmp_path / "run")
    assert _recorded(run)["data"]["seq_len"] == suggested
    [event] = [e for e in run.read_events() if e["kind"] == EVENT_KIND]
    assert event["evidence"]["data.seq_len"]["value"] == suggested and "suggested" in event["message"]
    assert run.read_summary()["status"] == "completed"
    assert recorded_sequence_length(run.tokenizer_dir()) == suggested  # the length its batches had


def test_the_length_rule_is_one_function():
    assert text_sequence_length(48, {"lengths": {"suggested_seq_len": 512}}) == 48
    assert text_sequence_length(None, {"lengths": {"suggested_seq_len": 512}}) == 512
    assert text_sequence_length(None, {"instruct": {"seq_len": 300}, "lengths": {"suggested_seq_len": 512}}) == 300
    assert text_sequence_length(None, {}) == DEFAULT_TEXT_SEQ_LEN


def test_chat_data_trains_at_its_longest_sample_not_at_prepares_cut(tmp_path):
    """Issue 35 item 1: prepare's default cut (2,048) was train's length, so 200 short conversations packed
    into a handful of rows: a few optimizer steps, and a model with a shorter context refused."""
    import json

    from tests.text.sft_data import reverse_chats

    from trainwise.data.text.prepare import summary_lines

    rows = reverse_chats(60)
    rows[0]["messages"][0]["content"] += " please" * 60  # one long sample: longer than prepare's suggestion
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = prepare_corpus(source, tmp_path / "ds", PrepareOptions(template="chatml", train_tokenizer=300,
                                                                        val_fraction=0.0, test_fraction=0.0)).manifest
    lengths = manifest["lengths"]
    assert manifest["instruct"]["seq_len"] == 2048 and lengths["suggested_seq_len"] == 64 < lengths["max"] <= 192
    config = load_recipe("sft-lora", [f"model.hf_config={tmp_path}", f"data.path={tmp_path / 'ds'}",
                                      "train.device=cpu", "train.micro_batch_size=1"])
    resolved = resolve_run(config)
    assert resolved.config.data.seq_len == -(-lengths["max"] // 64) * 64  # the long sample stays whole
    assert "longest sample" in resolved.event()["message"]
    said = f"(suggested {resolved.config.data.seq_len}, what train uses"  # prepare says the length train takes
    assert any(said in line for line in summary_lines(manifest))
    assert resolved.config.model.dtype == "fp32"  # the recipe's `auto` base dtype, on the CPU
    assert text_sequence_length(None, {"instruct": {"seq_len": 2048},
                                       "lengths": {"suggested_seq_len": 512, "max": 700}}) == 704
    assert text_sequence_length(None, {"instruct": {"seq_len": 48},  # prepare's --seq-len stays the ceiling
                                       "lengths": {"suggested_seq_len": 64, "max": 48}}) == 48


def test_a_frozen_base_is_fp32_on_the_cpu_and_bf16_on_a_bf16_card_unless_the_user_says(monkeypatch):
    """Issue 35 item 6: the sft-lora recipe's bf16 base trained on the CPU in bf16 weights, which is slow there;
    `auto` is decided by the device, recorded, and an explicit model.dtype is kept."""
    from trainwise.runtime import precision
    from trainwise.text.lm_builder import _dtype

    recipe = load_recipe("sft-lora", ["model.hf_config=llama-3.2-1b", "data.seq_len=64", "train.device=cpu",
                                      "train.micro_batch_size=1"])
    assert recipe.model.dtype == "auto"
    resolved = resolve_run(recipe)
    assert (resolved.config.model.dtype, resolved.config.train.precision) == ("fp32", "fp32")
    assert "model.dtype=fp32 (auto on cpu" in resolved.event()["message"]
    assert _dtype(recipe.model) == "float32" or torch.cuda.is_available()  # lr-find and check: the same rule
    explicit = resolve_run(load_recipe("sft-lora", ["model.hf_config=llama-3.2-1b", "data.seq_len=64",
                                                    "train.device=cpu", "train.micro_batch_size=1",
                                                    "model.dtype=bf16"]))
    assert explicit.config.model.dtype == "bf16" and "model.dtype" not in explicit.event()["evidence"]
    monkeypatch.setattr(precision, "resolve_precision", lambda name, device: "bf16")  # a bf16 card
    assert precision.resolve_weight_dtype("auto", torch.device("cpu")) == "bf16"
    assert precision.resolve_weight_dtype("fp32", torch.device("cpu")) == "fp32"


def test_the_legal_micro_batches_are_one_rule():
    from trainwise.plan.advise import micro_batch_for
    from trainwise.train.recovery.oom import smaller_micro_batch

    assert micro_batch_sizes(12) == [1, 2, 3, 4, 6, 12]
    assert micro_batch_at_most(48, 20) == 16 and micro_batch_at_most(7, 6) == 1 and micro_batch_at_most(8, 0) == 1
    assert micro_batch_for(48, 20) == 16 and micro_batch_for(48, 0) == 0  # the planner asks it
    assert smaller_micro_batch(16, 48) == 8 and smaller_micro_batch(12, 48) == 6  # so does the recovery
    assert smaller_micro_batch(1, 48) is None


def _ranks(monkeypatch, world_size: int) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


def test_strategy_auto_is_decided_by_the_resolve_step(monkeypatch):
    config = tiny_config(train={"device": "cpu"})
    assert resolve_run(config).config.train.strategy == "single"
    _ranks(monkeypatch, 2)
    resolved = resolve_run(config)
    assert resolved.config.train.strategy == "ddp" and "2 ranks on the cpu" in resolved.event()["message"]
    explicit = tiny_config(train={"device": "cpu", "strategy": "fsdp", "precision": "bf16"})
    assert resolve_run(explicit).choices == []  # what the user set is kept


def test_on_several_cards_the_planner_decides_the_strategy(monkeypatch):
    """The CUDA branch without a card: the device, its properties and the planner's answer stand in."""
    import trainwise.plan.strategy as planned

    asked = []

    def strategy_for(config, name, memory, ranks):
        asked.append((name, memory, ranks))
        return "fsdp", "a replica does not fit one card"

    class Card:
        name, total_memory = "NVIDIA H100 80GB HBM3", 80 * 2**30

    _ranks(monkeypatch, 4)
    monkeypatch.setattr(resolve, "resolve_device", lambda name, local_rank: torch.device("cuda", 0))
    monkeypatch.setattr(resolve, "resolve_precision", lambda name, device: "bf16")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Card)
    monkeypatch.setattr(planned, "strategy_for", strategy_for)
    resolved = resolve_run(tiny_config())
    assert resolved.config.train.strategy == "fsdp" and resolved.config.train.precision == "bf16"
    assert asked == [("NVIDIA H100 80GB HBM3", 80 * 2**30, 4)]
    assert "a replica does not fit one card" in resolved.event()["message"]


def test_the_planner_plans_an_unset_length_as_the_run_trains_it(prepared_text):
    from trainwise.plan.job import job_from_config

    data, suggested = prepared_text
    config = tiny_config(model={"name": None, "hf_config": "gpt2", "args": {}},
                         data={"name": "prepared", "path": str(data), "seq_len": None})
    job = job_from_config(config)
    notes = job.notes
    assert job.seq_len == suggested and not any("not set" in note for note in notes)
    assert job.precision == "bf16"  # `auto` on the bf16 cards plans are made for: the runtime's one rule


def test_a_config_that_leaves_a_setting_to_the_resolve_step_asks_for_the_recorded_run():
    from trainwise.config.derived import as_recorded

    asked = load_recipe("breast-cancer", ["train.micro_batch_size=auto"]).model_dump(mode="json")
    recorded = resolve_run(load_recipe("breast-cancer", ["train.micro_batch_size=auto"])).config
    recorded = recorded.model_dump(mode="json")
    assert asked != recorded and as_recorded(asked, recorded) == recorded
    # a setting the user gave is theirs: a different recorded value is a different run
    given = load_recipe("breast-cancer", ["train.strategy=ddp"]).model_dump(mode="json")
    assert as_recorded(given, recorded)["train"]["strategy"] == "ddp"


def test_what_ablate_treats_as_resolved_is_what_the_resolve_step_decides(prepared_text):
    """config.derived.RESOLVED_SETTINGS (ablate's reuse compares configs through it) lists exactly the settings
    the resolve step decides, plus the attention the model builder picks and config.yaml records."""
    from trainwise.config.derived import RESOLVED_SETTINGS

    data, _ = prepared_text
    config = load_recipe("lm-gpt", ["model.args.layers=1", "model.args.width=16", "model.args.heads=2",
                                    "train.device=cpu", f"data.path={data}", "data.seq_len=null",
                                    "train.precision=auto", "train.strategy=auto", "train.micro_batch_size=auto",
                                    "model.attention=auto", "model.dtype=auto", "train.batch_size=4"])
    decided = {choice.key for choice in resolve_run(config).choices}
    assert decided | {"model.attention"} == {f"{section}.{key}" for section, key in RESOLVED_SETTINGS}


def test_the_built_in_gpt_on_text_resolves_an_auto_micro_batch(prepared_text):
    """The built-in gpt's token batches trace like training's (per-document lengths read on the host; the token
    loss), so the planner behind `auto` can size its micro-batch."""
    data, _ = prepared_text
    config = load_recipe("lm-gpt", ["model.args.layers=1", "model.args.width=16", "model.args.heads=2",
                                    "train.device=cpu", f"data.path={data}", "train.micro_batch_size=auto",
                                    "train.batch_size=4"])
    micro = resolve_run(config).config.train.micro_batch_size
    assert isinstance(micro, int) and 4 % micro == 0
