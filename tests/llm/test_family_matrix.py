"""Every catalogue family computes a packed row's documents exactly as if each were alone, sees no later token,
and trains the same through the chunked loss, DDP (2 gloo ranks) and FSDP2: packing reaches the model as
position ids only (no hand-made mask), so each family's own masks (eager's additive one, sliding windows,
soft-capping, GQA) stay as transformers builds them."""
from __future__ import annotations

import pytest
import torch

from trainwise.data.batch import IGNORE_INDEX, token_loss_sum
from trainwise.train.step.train_step import TokenLossModel, TrainStep

transformers = pytest.importorskip("transformers")

VOCAB = 64
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
FAMILIES = {  # (config class, fields, attention implementations to try)
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                bos_token_id=None, eos_token_id=None), ("sdpa",)),
    "llama": ("LlamaConfig", dict(SMALL, num_key_value_heads=4), ("sdpa",)),
    "qwen2-gqa": ("Qwen2Config", dict(SMALL, num_key_value_heads=2), ("sdpa",)),
    "mistral": ("MistralConfig", dict(SMALL, num_key_value_heads=2, sliding_window=8), ("sdpa",)),
    "phi3-window": ("Phi3Config", dict(SMALL, num_key_value_heads=4, sliding_window=8), ("sdpa",)),
    "gemma2-eager": ("Gemma2Config", dict(SMALL, num_key_value_heads=2, head_dim=8, sliding_window=8,
                                          attn_logit_softcapping=20.0, final_logit_softcapping=10.0,
                                          query_pre_attn_scalar=8), ("eager",)),
    "mixtral": ("MixtralConfig", dict(SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                      sliding_window=8), ("sdpa",)),
}
DOCUMENTS = (9, 15, 8)  # a packed row of 32 tokens: the middle document is longer than the windows


def family_model(family: str) -> torch.nn.Module:
    from trainwise.llm import hf

    config_class, fields, attention = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**fields)
    model = hf.build_model(config, device="cpu", attention=attention)
    model.config.use_cache = False
    return model.eval()


def packed_row(seed: int = 0) -> tuple[dict[str, torch.Tensor], list[slice]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, sum(DOCUMENTS)), generator=g)
    positions = torch.cat([torch.arange(n) for n in DOCUMENTS]).unsqueeze(0)
    labels = torch.full_like(ids, IGNORE_INDEX)
    spans, start = [], 0
    for n in DOCUMENTS:
        labels[0, start:start + n - 1] = ids[0, start + 1:start + n]  # the next token of the same document
        spans.append(slice(start, start + n))
        start += n
    return {"input_ids": ids, "labels": labels, "position_ids": positions}, spans


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_packed_row_computes_each_document_as_if_alone(family):
    model = family_model(family)
    batch, spans = packed_row()
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        alone_loss = torch.zeros(())
        for span in spans:
            alone = model(input_ids=batch["input_ids"][:, span]).logits
            torch.testing.assert_close(packed[:, span], alone, rtol=0, atol=1e-5)
            alone_loss += token_loss_sum(alone, batch["labels"][:, span])
        torch.testing.assert_close(token_loss_sum(packed, batch["labels"]), alone_loss, rtol=1e-6, atol=1e-5)
        inputs = {k: batch[k] for k in ("input_ids", "position_ids")}
        chunked = TokenLossModel(model, 5)(labels=batch["labels"], **inputs)
        torch.testing.assert_close(chunked, alone_loss, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_later_token_changes_no_earlier_logit(family):
    model = family_model(family)
    batch, _ = packed_row()
    changed = batch["input_ids"].clone()
    changed[0, 20] = (changed[0, 20] + 1) % VOCAB
    with torch.no_grad():
        before = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        after = model(input_ids=changed, position_ids=batch["position_ids"]).logits
    torch.testing.assert_close(after[:, :20], before[:, :20], rtol=0, atol=0)
    assert not torch.allclose(after[:, 20:24], before[:, 20:24])  # the change is seen where it may be
    torch.testing.assert_close(after[:, 24:], before[:, 24:], rtol=0, atol=0)  # the next document never sees it


def one_step(model, chunk, forward=None, no_sync=None, rows=slice(None)):
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.5), loss_fn=None, precision="fp32",
                     device=torch.device("cpu"), loss_chunk_size=chunk, forward=forward, no_sync=no_sync)
    batches = [packed_row(seed)[0] for seed in range(4)][rows]
    half = len(batches) // 2
    return step([_stack(batches[:half]), _stack(batches[half:])])  # two micro-batches: no_sync, then the sync


def _stack(batches):
    return {key: torch.cat([b[key] for b in batches]) for key in batches[0]}


@pytest.mark.parametrize("family", ["llama", "gemma2-eager"])
def test_the_chunked_step_equals_the_plain_one(family):
    states = []
    for chunk in (None, 7):
        model = family_model(family).train()
        one_step(model, chunk)
        states.append(model.state_dict())
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, rtol=1e-4, atol=1e-6)


def _ddp_worker(rank: int, world: int, init_file: str, out: str, chunk) -> None:
    import torch.distributed as dist

    from trainwise.train.parallel.distributed import leaving_the_job, wrap_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    with leaving_the_job():
        model = family_model("qwen2-gqa").train()
        forward, no_sync = wrap_model(model, "ddp", device=torch.device("cpu"), precision="fp32",
                                      cpu_offload=False, loss_chunk=chunk)  # as the Trainer wraps it
        one_step(model, chunk, forward=forward, no_sync=no_sync, rows=slice(rank * 2, rank * 2 + 2))
        torch.save(model.state_dict(), f"{out}.{rank}")


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [None, 7])
def test_two_gloo_ranks_keep_identical_weights(tmp_path, chunk):
    import torch.multiprocessing as mp

    out = str(tmp_path / "state")
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), out, chunk), nprocs=2, join=True)
    first, second = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    untrained = family_model("qwen2-gqa").state_dict()
    for name, value in first.items():
        torch.testing.assert_close(second[name], value, rtol=0, atol=0)
    assert any(not torch.equal(first[name], untrained[name]) for name in first)  # a step was taken


def _fsdp_worker(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from trainwise.train.parallel.distributed import leaving_the_job, wrap_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    with leaving_the_job():
        model = family_model("llama").train()
        forward, no_sync = wrap_model(model, "fsdp", device=torch.device("cpu"), precision="fp32",
                                      cpu_offload=False, loss_chunk=7)
        one_step(model, 7, forward=forward, no_sync=no_sync)
        torch.save({name: value.full_tensor() for name, value in model.state_dict().items()}, out)


@pytest.mark.slow
def test_fsdp2_one_rank_runs_the_chunked_loss_like_one_process(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "state")
    mp.spawn(_fsdp_worker, args=(1, str(tmp_path / "init"), out), nprocs=1, join=True)
    sharded = torch.load(out)
    model = family_model("llama").train()
    one_step(model, None)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(sharded[name], value, rtol=1e-4, atol=1e-6)


class FlashStandIn(torch.nn.Module):
    """A model that says it runs FlashAttention (the step then flattens its batches, padding-free, with the
    documents' boundaries); it records what it is called with and computes through an SDPA Llama, which reads
    the same documents from the flattened position ids."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []
        self.config = type("Config", (), {"_attn_implementation": "flash_attention_2"})()

    def forward(self, **inputs):
        self.calls.append(inputs)
        return self.model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"])


def test_a_flash_attention_model_gets_flattened_rows_and_the_same_loss():
    batch, _ = packed_row()
    padded = {key: torch.cat([value, torch.zeros_like(value[:, :8])], dim=1) for key, value in batch.items()}
    padded["labels"][:, -8:] = IGNORE_INDEX  # a pack's padded tail
    padded["position_ids"][:, -8:] = torch.arange(8)
    losses = []
    for flash in (False, True):
        model = family_model("llama").train()
        model = FlashStandIn(model) if flash else model
        step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.0), loss_fn=None, precision="fp32",
                         device=torch.device("cpu"))
        losses.append(step([padded]).loss)
    torch.testing.assert_close(losses[1], losses[0])
    call = model.calls[0]
    assert call["input_ids"].shape == (1, sum(DOCUMENTS))  # the padding never reaches the kernel
    assert call["cu_seq_lens_q"].tolist() == [0, 9, 24, 32] and call["max_length_q"] == 15


def test_attention_is_chosen_by_what_the_machine_runs(monkeypatch):
    from transformers.utils import import_utils

    from trainwise.llm import hf

    assert hf.attention_choices("cpu") == ("sdpa", "eager")
    monkeypatch.setattr(import_utils, "is_flash_attn_2_available", lambda: False)
    monkeypatch.setattr(import_utils, "is_flash_attn_3_available", lambda: False, raising=False)
    assert hf.attention_choices("cuda") == ("flex_attention", "sdpa", "eager")
    monkeypatch.setattr(import_utils, "is_flash_attn_2_available", lambda: True)
    assert hf.attention_choices("cuda")[0] == "flash_attention_2"
    assert hf.attention_of(family_model("gemma2-eager")) == "eager"  # no SDPA path: the family's own eager


def test_a_training_model_builds_no_kv_cache(tmp_path):
    import json

    from trainwise.config.schema import ModelConfig
    from trainwise.data.bundle import DataSpec
    from trainwise.text.lm_builder import build_language_model

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", **SMALL, "num_key_value_heads": 2}))
    spec = DataSpec(input_shape=(32,), num_classes=VOCAB, task="causal_lm", input_dtype=torch.long)
    model = build_language_model(ModelConfig(hf_config=str(config)), spec)
    assert model.config.use_cache is False
    batch, _ = packed_row()
    assert model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).past_key_values is None
