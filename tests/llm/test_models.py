"""trainwise.llm: the catalogue, building HF models from configs, methods, checkpointing, parameter counts."""
from __future__ import annotations

import json
import os
import sys
import warnings

import psutil
import pytest
import torch

from trainwise.errors import ConfigError
from trainwise.llm import catalogue, hf, methods
from trainwise.llm.optional import MissingExtraError, available, require

from .conftest import tiny_config, tiny_model


def test_every_catalogue_config_builds_on_meta_with_its_published_parameter_count():
    for name in catalogue.names():
        entry = catalogue.lookup(name)
        model = hf.build_model(hf.resolve_config(name), device="meta")
        assert methods.parameter_counts(model).total == entry.parameters, name
        assert entry.config["model_type"]


def test_catalogue_names_are_forgiving_and_unknown_names_suggest():
    assert catalogue.canonical_name("Llama-3.1-8B") == "llama-3.1-8b"
    assert catalogue.canonical_name("meta-llama/Llama-3.1-8B") == "llama-3.1-8b"
    assert catalogue.canonical_name("gpt2-1.5b") == "gpt2-xl"
    with pytest.raises(ConfigError, match="did you mean llama-3.1-8b"):
        catalogue.lookup("llama-3.1-8")
    assert hf.looks_like_config_spec("qwen2.5-7b") and not hf.looks_like_config_spec("recipes/digits.yaml")


def test_meta_build_of_an_8b_model_allocates_nothing():
    import gc
    gc.collect()
    before = psutil.Process().memory_info().rss
    model = hf.build_model(hf.resolve_config("llama-3.1-8b"), device="meta", dtype="bf16")
    grown = psutil.Process().memory_info().rss - before
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in model.parameters())
    assert grown < 200 * 2**20, f"meta build grew RSS by {grown / 2**20:.0f} MiB (16 GB of weights if real)"


def test_config_json_path_and_model_directory_resolve(tmp_path):
    model = tiny_model("qwen")
    model.save_pretrained(tmp_path / "m")
    from_dir = hf.resolve_config(str(tmp_path / "m"))
    from_file = hf.resolve_config(str(tmp_path / "m" / "config.json"))
    assert from_dir.hidden_size == from_file.hidden_size == 64 and from_dir.model_type == "qwen2"
    loaded = hf.load_pretrained(tmp_path / "m")
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(tiny_config("llama").to_dict()))
    with pytest.raises(ConfigError, match="no weights"):
        hf.load_pretrained(tmp_path / "cfg")
    (tmp_path / "bad.json").write_text("{\"hidden_size\": 3}")
    with pytest.raises(ConfigError, match="model_type"):
        hf.resolve_config(str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="never downloads"):
        hf.resolve_config(str(tmp_path / "missing" / "config.json"))


def test_build_casts_to_the_requested_dtype():
    model = tiny_model("llama", dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def _loss(model, tokens=None):
    tokens = tokens if tokens is not None else torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    logits = model(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def test_full_trains_everything_and_freeze_only_the_last_blocks_and_head():
    model = methods.apply_method(tiny_model("llama-untied"), "full")
    counts = methods.parameter_counts(model)
    assert counts.total == counts.trainable
    model = methods.apply_method(tiny_model("llama-untied"), "freeze", trainable_blocks=1)
    expected = sum(p.numel() for p in model.model.layers[-1].parameters()) + model.lm_head.weight.numel()
    assert methods.parameter_counts(model).trainable == expected
    _loss(model).backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad is None
    assert model.model.layers[1].self_attn.q_proj.weight.grad is not None
    with pytest.raises(ConfigError, match="has 2 blocks"):
        methods.apply_method(tiny_model("llama"), "freeze", trainable_blocks=5)


def test_freeze_with_a_tied_head_trains_the_shared_embedding_once():
    model = methods.apply_method(tiny_model("gpt2"), "freeze", trainable_blocks=1)
    assert model.lm_head.weight is model.transformer.wte.weight and model.transformer.wte.weight.requires_grad
    counts = methods.parameter_counts(model)
    assert counts.total == sum(p.numel() for p in set(model.parameters()))
    assert counts.trainable == sum(p.numel() for p in model.transformer.h[-1].parameters()) + 512 * 64


def test_lora_wraps_every_linear_but_the_head_and_trains_only_adapters():
    base = tiny_model("llama")
    frozen_before = {n: p.detach().clone() for n, p in base.named_parameters()}
    linears = [m for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecation noise from peft/transformers in a run's log
        model = methods.apply_method(base, "lora", lora=methods.LoraSettings(rank=4, alpha=8.0, dropout=0.0))
    expected = sum(4 * (m.in_features + m.out_features) for m in linears)
    assert len(linears) == 2 * 7 and methods.parameter_counts(model).trainable == expected
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    _loss(model).backward()
    opt.step()
    for name, p in base.named_parameters():
        original = name.replace(".base_layer", "")
        if "lora_" not in name:
            assert torch.equal(p, frozen_before[original]), name


def test_lora_on_a_plain_torch_model_expands_all_linear_itself():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    model = methods.apply_method(Tiny(), "lora", lora=methods.LoraSettings(rank=2))
    assert methods.parameter_counts(model).trainable == 2 * 2 * (8 + 8)


def test_lora_on_a_bf16_model_built_on_meta_plans():
    model = methods.apply_method(tiny_model("qwen", device="meta", dtype="bf16"), "lora")
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.device.type == "meta" for p in trainable)


def test_qlora_is_refused_on_the_cpu_with_the_reason():
    with pytest.raises(ConfigError, match="CUDA GPUs only"):
        methods.apply_method(tiny_model("llama"), "qlora", device="cpu")
    assert "CUDA" in methods.qlora_unavailable_reason("cpu")


def _recomputed_forwards(model) -> int:
    calls = []  # a pre-hook: non-reentrant recomputation stops as soon as the saved tensors are rebuilt
    methods.transformer_blocks(model)[0].mlp.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    model.train()
    loss = _loss(model)
    forwards = len(calls)
    loss.backward()
    return len(calls) - forwards


@pytest.mark.parametrize("method", ["full", "lora"])
def test_gradient_checkpointing_on_a_hf_model_really_recomputes_in_backward(method):
    plain = methods.apply_method(tiny_model("llama"), method)
    assert _recomputed_forwards(plain) == 0
    model = methods.apply_method(tiny_model("llama"), method)
    assert methods.enable_gradient_checkpointing(model) and methods.gradient_checkpointing_enabled(model)
    assert _recomputed_forwards(model) == 1


def test_apply_model_config_reads_the_model_section():
    from types import SimpleNamespace
    section = SimpleNamespace(method="lora", trainable_blocks=2, gradient_checkpointing=True,
                              lora={"rank": 2, "alpha": 4.0, "dropout": 0.0, "target_modules": ["q_proj"]})
    model = methods.apply_model_config(tiny_model("llama"), section)
    assert methods.gradient_checkpointing_enabled(model)
    assert methods.parameter_counts(model).trainable == 2 * 2 * (64 + 64)


def test_without_the_extra_the_message_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "peft", None)
    assert not available("transformers")
    with pytest.raises(MissingExtraError, match=r"pip install 'trainwise\[llm\]'"):
        hf.resolve_config("gpt2")
    with pytest.raises(MissingExtraError, match="LoRA"):
        require("peft")
    with pytest.raises(MissingExtraError, match=r"trainwise\[llm\]"):
        methods.apply_method(torch.nn.Linear(2, 2), "lora")


def test_importing_the_package_does_not_import_transformers():
    import subprocess
    code = ("import sys, trainwise.llm.catalogue, trainwise.llm.hf, trainwise.llm.methods, trainwise.llm.optional;"
            "print('transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=True).stdout
    assert out.split() == ["False", "False"]


MOE = dict(model_type="mixtral", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
           num_key_value_heads=2, head_dim=16, vocab_size=512, num_local_experts=4, num_experts_per_tok=2)


def test_lora_on_fused_experts_leaves_dropout_out_and_says_so():
    """transformers 5 keeps a mixture-of-experts block's experts in one 3-D tensor; peft adapts it as a parameter
    and has no dropout there. The adapters are the ones peft makes with dropout 0, and the run is told."""
    import peft

    settings = methods.LoraSettings(rank=4)
    with pytest.warns(UserWarning, match="LoRA dropout 0.05 left out"):
        ours = methods.add_lora(hf.build_model(hf.resolve_config(MOE), device="cpu"), settings)
    reference = peft.get_peft_model(hf.build_model(hf.resolve_config(MOE), device="cpu"),
                                    peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                                    task_type="CAUSAL_LM"))
    def trainable(model):
        return sorted((n, p.numel()) for n, p in model.named_parameters() if p.requires_grad)
    assert trainable(ours) == trainable(reference) and any("experts" in n for n, _ in trainable(ours))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dense model keeps its dropout, silently
        methods.add_lora(tiny_model(), settings)


def test_lora_on_gpt2s_conv1d_layers_is_quiet_and_a_catalogue_name_as_model_hf_says_what_to_do():
    """Issue 35: GPT-2's transposed Conv1D projections made peft warn once per layer; `model.hf=gpt2` (a
    catalogue name, not a directory) is refused with the two ways on."""
    base = hf.build_model(hf.resolve_config("gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=64), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model = methods.apply_method(base, "lora", lora=methods.LoraSettings(rank=4, alpha=8.0, dropout=0.0))
    assert methods.parameter_counts(model).trainable > 0
    with pytest.raises(ConfigError, match=r"model\.hf_config=gpt2 builds a randomly initialised gpt2.*model\.hf=DIR"):
        hf.load_pretrained("gpt2")
