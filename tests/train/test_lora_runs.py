"""A LoRA run keeps only what trains: checkpoints and final weights hold the adapter (and the head it trains),
a resume restores them and the optimizer state onto the rebuilt base bit for bit, the run leaves the adapter in
peft's format, and evaluation loads it onto the base. The same under FSDP2 (sharded checkpoints)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import stop_at, tiny_config
from tests.train.lora_models import fsdp_world_of_one
from trainwise.errors import RunDirError
from trainwise.rundir.layout import RunDir
from trainwise.rundir.checkpoint_files import read_checkpoint
from trainwise.launch.runs import build_trainer, train_run

pytest.importorskip("peft")


def lora_config(**model_args):
    return tiny_config(model={"name": None, "factory": "tests.train.lora_models:lora_mlp", "args": model_args},
                       train={"max_steps": 12, "batch_size": 32, "log_every": 3, "device": "cpu", "sanity": False},
                       data={"num_workers": 0}, eval={"every_steps": 6}, checkpoint={"every_steps": 4})


def under_fsdp(config):
    return config.model_copy(update={"train": config.train.model_copy(update={"strategy": "fsdp"})})


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return train_run(lora_config(), tmp_path_factory.mktemp("lora") / "straight")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The same run under train.strategy=fsdp, in a one-rank process group: the model is sharded with
    fully_shard (DTensor parameters) and checkpoints are DCP directories."""
    run = RunDir.create(tmp_path_factory.mktemp("lora") / "fsdp")
    with fsdp_world_of_one():
        trainer = build_trainer(under_fsdp(lora_config()), run)
        trainer.fit()
    return trainer


def test_checkpoints_and_final_weights_hold_only_what_trains(straight):
    state = read_checkpoint(straight.checkpoint_path("last"))
    assert state["weights_scope"] == "trainable" and "4 tensors" in state["frozen_fingerprint"]
    names = set(state["model"])
    assert names and all("lora_" in n or "modules_to_save" in n for n in names), names
    assert not any("base_layer" in n or "original_module" in n for n in names)
    final = load_file(straight.model_path)
    assert set(final) == names


def test_a_stopped_lora_run_resumes_bit_identical(straight, tmp_path):
    config = lora_config()
    run = RunDir.create(tmp_path / "stopped")
    build_trainer(config, run, [stop_at(5)]).fit()
    assert read_checkpoint(run.checkpoint_path("last"))["step"] == 5
    assert build_trainer(config, RunDir(run.path)).fit(resume=True)["status"] == "completed"
    a, b = load_file(straight.model_path), load_file(run.model_path)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    sa = read_checkpoint(straight.checkpoint_path("last"))["optimizer"]["state"]
    sb = read_checkpoint(run.checkpoint_path("last"))["optimizer"]["state"]
    assert all(sa[i]["exp_avg_sq"].equal(sb[i]["exp_avg_sq"]) for i in sa)


def test_the_adapter_loads_in_peft_with_the_trained_outputs(straight):
    from peft import PeftModel

    from tests.train.lora_models import TwoLayer, lora_mlp

    assert {p.name for p in straight.adapter_dir().iterdir()} >= {"adapter_model.safetensors", "adapter_config.json"}
    trained = lora_mlp(type("Spec", (), {"input_shape": (30,), "num_classes": 2})())
    trained.load_state_dict(load_file(straight.model_path), strict=False)
    with torch.random.fork_rng():
        torch.manual_seed(7)
        base = TwoLayer(30, 2)
    loaded = PeftModel.from_pretrained(base, str(straight.adapter_dir())).eval()
    x = torch.randn(5, 30)
    assert torch.equal(loaded(x), trained.eval()(x))
    assert RunDir(straight.path).verify(straight.adapter_dir() / "adapter_model.safetensors") is None


def test_evaluate_puts_the_adapter_on_the_rebuilt_base_and_refuses_another_base(straight):
    from trainwise.evaluate.run_eval import evaluate_run

    result = evaluate_run(straight.path, split="val", checkpoint="final", trust_code=True)
    logged = [r for r in straight.read_metrics("val") if r["step"] == 12][0]
    assert result["accuracy"] == pytest.approx(logged["accuracy"])  # the same model the run measured
    other = RunDir(straight.path)
    config = other.read_config()
    changed = config.model_copy(update={"model": config.model.model_copy(update={"args": {"base_seed": 8}})})
    other.write_config(changed)
    try:
        with pytest.raises(RunDirError, match="frozen base weights differ"):
            evaluate_run(straight.path, split="test", checkpoint="final", trust_code=True)
    finally:
        other.write_config(config)


def test_fsdp_shards_the_lora_model_and_keeps_only_the_adapter(straight, sharded):
    from peft import PeftModel
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.tensor import DTensor

    from tests.train.lora_models import TwoLayer
    from trainwise.runtime.model_state import saved_record

    assert all(isinstance(p, DTensor) for p in sharded.model.parameters())  # frozen and trainable alike
    trainable = sum(p.nbytes for p in sharded.model.parameters() if p.requires_grad)
    assert sharded.checkpointer.size_bytes() == 3 * trainable  # the free-space check counts no frozen base
    run = sharded.run_dir
    last = run.checkpoint_dirs.pointer("last")
    stored = {n.removeprefix("model.") for n in FileSystemReader(last).read_metadata().state_dict_metadata
              if n.startswith("model.")}
    assert stored == set(load_file(straight.model_path))  # the adapter and the head it trains, not the base
    assert "4 tensors" in saved_record(last)["frozen_fingerprint"]
    a, b = load_file(straight.model_path), load_file(run.model_path)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # the same update as one process
    adapter = run.adapter_dir() / "adapter_model.safetensors"
    assert load_file(adapter).keys() == load_file(straight.adapter_dir() / "adapter_model.safetensors").keys()
    with torch.random.fork_rng():
        torch.manual_seed(7)
        base = TwoLayer(30, 2)
    loaded = PeftModel.from_pretrained(base, str(run.adapter_dir())).eval()
    trained = lora_mlp_with(b)
    x = torch.randn(5, 30)
    assert torch.equal(loaded(x), trained(x))


def lora_mlp_with(weights):
    from tests.train.lora_models import lora_mlp

    model = lora_mlp(type("Spec", (), {"input_shape": (30,), "num_classes": 2})())
    model.load_state_dict(weights, strict=False)
    return model.eval()


def test_a_stopped_fsdp_lora_run_resumes_bit_identical_and_evaluates_from_its_shards(sharded, tmp_path):
    from trainwise.evaluate.run_eval import evaluate_run

    config = under_fsdp(lora_config())
    run = RunDir.create(tmp_path / "stopped")
    with fsdp_world_of_one():
        build_trainer(config, run, [stop_at(5)]).fit()
    with fsdp_world_of_one():
        assert build_trainer(config, RunDir(run.path)).fit(resume=True)["status"] == "completed"
    a, b = load_file(sharded.run_dir.model_path), load_file(run.model_path)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    result = evaluate_run(run.path, split="val", checkpoint="last", trust_code=True)  # the adapter on the base
    logged = [r for r in run.read_metrics("val") if r["step"] == 12][0]
    assert result["accuracy"] == pytest.approx(logged["accuracy"])
    other = config.model_copy(update={"model": config.model.model_copy(update={"args": {"base_seed": 8}})})
    with fsdp_world_of_one(), pytest.raises(RunDirError, match="frozen base weights differ"):
        build_trainer(other, RunDir(run.path)).fit(resume=True)


@pytest.mark.parametrize("lr,code", [(2e-4, "overfit_probe"), (0.0, "overfit_probe_failed")])
def test_the_sanity_probe_judges_adapters_by_their_wiring_not_a_full_models_pace(lr, code):
    """At a fine-tuning LR a rank-4 adapter cannot memorise a batch in 40 steps: no false warning; a wiring
    fault (here LR 0: nothing moves) is still an error."""
    from trainwise.check.sanity import sanity_check
    from trainwise.recipes.factories import build_data

    config = lora_config(train_head=False)
    config = config.model_copy(update={"optim": config.optim.model_copy(update={"lr": lr})})
    probe = [f for f in sanity_check(config, build_data(config)) if f.code.startswith("overfit")][0]
    assert probe.code == code, probe.title
    assert probe.evidence["frozen_base"] and probe.evidence["run_lr"] == lr


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_train_the_adapter_like_one_process(tmp_path, capsys, strategy):
    """torchrun, 2 Gloo ranks: under DDP the frozen base stays out of the gradient all-reduce, under FSDP2 each
    rank holds half of every weight and the checkpoint only the adapter's; the adapter trains as in one process
    accumulating the same micro-batches, and rank 0 alone writes it (gathered from the shards under FSDP)."""
    from tests.conftest import finish_job, invoke, start_torchrun
    from trainwise.config import dump_yaml

    config = lora_config(dropout=0.0, train_head=False)
    config = config.model_copy(update={"train": config.train.model_copy(update={"micro_batch_size": 16,
                                                                                "strategy": strategy})})
    recipe = tmp_path / "lora.yaml"
    recipe.write_text(dump_yaml(config))
    job = start_torchrun("train", str(recipe), "--out", str(tmp_path / "ranks"))
    single = config.model_copy(update={"train": config.train.model_copy(update={"strategy": "single"})})
    (tmp_path / "single.yaml").write_text(dump_yaml(single))
    assert invoke(capsys, "train", str(tmp_path / "single.yaml"), "--out", str(tmp_path / "single")).returncode == 0
    code, output = finish_job(job, timeout=600)
    assert code == 0, output[-3000:]
    a, b = load_file(tmp_path / "single" / "model.safetensors"), load_file(tmp_path / "ranks" / "model.safetensors")
    assert a.keys() == b.keys() and all("lora_" in k for k in a)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
    from trainwise.runtime.model_state import same_base, saved_record

    # the frozen base's fingerprint: each rank sums its shards, one all-reduce adds them up
    prints = [saved_record(tmp_path / run / "model.safetensors")["frozen_fingerprint"] for run in ("single", "ranks")]
    assert "4 tensors" in prints[0] and same_base(*prints)
    adapter = load_file(tmp_path / "ranks" / "adapter" / "adapter_model.safetensors")
    assert adapter.keys() == load_file(tmp_path / "single" / "adapter" / "adapter_model.safetensors").keys()
