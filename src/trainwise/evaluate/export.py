"""`trainwise export RUN --to DIR`: a run's final language model as a Hugging Face model directory
(config.json + generation_config.json + model.safetensors + the tokenizer), loadable with transformers'
AutoModelForCausalLM and AutoTokenizer, and stopping there where it stops in trainwise (export_tokens.py).

A Hugging Face model (model.hf / model.hf_config) is saved as it is. The built-in gpt has GPT-2's layout,
so it maps onto GPT2LMHeadModel tensor for tensor: the linear layers are stored transposed (GPT-2's Conv1D
keeps [in, out]), a model built without biases gets zero biases, and the head stays tied to the token
embedding. Its learned positions end at its context (64 for lm-gpt), where transformers' generate would
fail with an IndexError: the export gives GPT-2 at least GPT-2's 1,024 positions, those past the context
repeating the last one, so logits inside the context are unchanged and a longer generate runs (on text
the model never saw that far); the tokenizer's model_max_length and the message say the real context.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from trainwise.errors import ConfigError
from trainwise.evaluate.export_tokens import apply_ids, export_tokens, save_tokenizer
from trainwise.evaluate.run_model import load_run_model
from trainwise.data.text.chat_templates import saved_template
from trainwise.text.gpt import GPT

TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_POSITIONS = 1024  # the fewest positions an exported gpt gets (GPT-2's own): generate(max_new_tokens=100) runs


def gpt2_config(model: GPT, positions: int | None = None) -> Any:
    from trainwise.llm.optional import require

    transformers = require("transformers", "exporting to a Hugging Face directory")
    config = model.config
    return transformers.GPT2Config(vocab_size=config.vocab_size, n_positions=positions or config.context,
                                   n_embd=config.width, n_layer=config.layers, n_head=config.heads,
                                   activation_function="gelu_new", resid_pdrop=config.dropout,
                                   embd_pdrop=config.dropout, attn_pdrop=config.dropout, layer_norm_epsilon=1e-5,
                                   tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)  # the export's


def gpt2_state_dict(model: GPT, positions: int | None = None) -> dict[str, torch.Tensor]:
    """The built-in gpt's weights under GPT2LMHeadModel's names and layouts; `positions` beyond the context
    repeat the last position's embedding."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: the same tensor as transformer.wte.weight
        tensor = tensor.detach().clone()
        state[f"transformer.{name}"] = tensor.t().contiguous() if name.endswith(TRANSPOSED) else tensor
    if not model.config.bias:  # GPT-2 always has biases: zeros change nothing
        for name, module in model.named_modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and name != "lm_head":
                width = module.weight.shape[0] if isinstance(module, torch.nn.Linear) else module.weight.shape[-1]
                state.setdefault(f"transformer.{name}.bias", torch.zeros(width, dtype=module.weight.dtype))
    table = state["transformer.wpe.weight"]
    if positions and positions > len(table):
        state["transformer.wpe.weight"] = torch.cat([table, table[-1:].expand(positions - len(table), -1)])
    return state


def as_hugging_face(model: GPT, positions: int | None = None) -> torch.nn.Module:
    """The built-in gpt as a GPT2LMHeadModel with `positions` positions (None: its context)."""
    from trainwise.llm.optional import require

    transformers = require("transformers", "exporting to a Hugging Face directory")
    exported = transformers.GPT2LMHeadModel(gpt2_config(model, positions))
    missing, unexpected = exported.load_state_dict(gpt2_state_dict(model, positions), strict=False)
    missing = [key for key in missing if key != "lm_head.weight" and not key.endswith(".attn.bias")]
    if missing or unexpected:
        raise AssertionError(f"the gpt -> GPT-2 mapping is incomplete: missing {missing}, unexpected {unexpected}")
    exported.tie_weights()
    return exported.eval()


def export_run(path: str | Path, to: str | Path, *, trust_code: bool = False, merge: bool = False,
               merge_in: str = "fp32", dtype: str | None = None) -> dict[str, Any]:
    """Write the run's final model (and tokenizer) as a Hugging Face directory at `to` (new or empty).
    `merge`: a LoRA run's adapter folded into its base (peft's merge_and_unload): a plain model, no peft needed;
    the merge computes in `merge_in` (fp32, or `base`: the base's dtype). The weights are saved in `dtype`
    (fp32/bf16/fp16; None: the base's own dtype)."""
    to = Path(to)
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ConfigError(f"--to {to}: exists and is not an empty directory; give a new one (nothing is overwritten).")
    loaded = load_run_model(path, trust_code=trust_code)
    model = loaded.model
    if merge and not hasattr(model, "peft_config"):
        raise ConfigError(f"--merge: {path} has no adapter to merge (model.method={loaded.config.model.method}: its "
                          "weights are whole already); export it without --merge.")
    if hasattr(model, "peft_config") and not merge:
        raise ConfigError(f"{path} trained LoRA adapters (model.method={loaded.config.model.method}): export them merged "
                          f"into the base model with `trainwise export {path} --merge --to {to}`.")
    template = saved_template(loaded.run.tokenizer_dir(), loaded.tokenizer)
    context = model_context(model)
    # a pretrained model's own end ids mean something (Llama 3's several); a random init's are its config's defaults
    tokens = export_tokens(loaded.tokenizer, template, model if loaded.config.model.hf else None)
    own, positions = base_dtype(model), None
    if isinstance(model, GPT):
        positions = max(context, GPT2_POSITIONS)
        model = as_hugging_face(model, positions)
    model, precision_note = merged_model(model, merge_in, dtype) if merge else saved_in(model, dtype, own)
    apply_ids(model, tokens)
    partial = to.with_name(to.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial), safe_serialization=True)
    tokenizer_note = save_tokenizer(loaded.tokenizer, partial, tokens, context)
    if getattr(template, "jinja", ""):
        # the built-in template the data was rendered with, in the form transformers' apply_chat_template reads
        (partial / "chat_template.jinja").write_text(template.jinja)
        tokenizer_note += f", with the {template.name} chat template"
    if to.exists():
        to.rmdir()
    partial.rename(to)
    return {"directory": str(to), "architecture": type(model).__name__, "tokenizer": tokenizer_note,
            "weights": precision_note, "special_tokens": tokens.describe(),
            "context": context_note(context, loaded.spec.input_shape[0], positions),
            "warnings": [tokens.warning] if tokens.warning else []}


def model_context(model: Any) -> int:
    """How many positions the model reads: the built-in gpt's context, a transformers config's limit."""
    if isinstance(model, GPT):
        return model.config.context
    config = model.config
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0) or 0)


def context_note(context: int, trained: int, positions: int | None = None) -> str:
    """The context limit, as the export's message says it; `positions`: how many a gpt was given."""
    note = f"{context:,} positions" + (f" (trained on sequences of {trained:,})" if trained < context else "")
    if positions and positions > context:
        note += (f"; positions {context:,}..{positions - 1:,} repeat the last one, so generate() past "
                 f"{context:,} tokens runs, on text longer than the model learned")
    return note


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_NAMES = {value: key for key, value in _DTYPES.items()}


def base_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype most of the model's (base) weights are stored in: what an export keeps unless told otherwise."""
    sizes: dict[torch.dtype, int] = {}
    for parameter in model.parameters():
        if parameter.is_floating_point():
            sizes[parameter.dtype] = sizes.get(parameter.dtype, 0) + parameter.numel()
    return max(sizes, key=sizes.get) if sizes else torch.float32


def merged_model(model: Any, merge_in: str = "fp32", dtype: str | None = None) -> tuple[torch.nn.Module, str]:
    """A peft model's adapters folded into its base, computed in fp32 (`merge_in="base"`: in the base's dtype,
    as peft does by default), then cast to `dtype` (None: the base's). Returns the model and a note saying which."""
    if merge_in not in ("fp32", "base"):
        raise ConfigError(f"--merge-in {merge_in}: use fp32 (exact) or base (the base weights' dtype).")
    base = base_dtype(model)
    compute = torch.float32 if merge_in == "fp32" else base
    merged = model.to(compute).merge_and_unload()
    saved, note = saved_in(merged, dtype, default=base)
    return saved, f"merged in {_NAMES.get(compute, str(compute))}, {note}"


def saved_in(model: torch.nn.Module, dtype: str | None, default: torch.dtype | None = None
             ) -> tuple[torch.nn.Module, str]:
    """`model` cast to `dtype` (None: kept in `default`, or its own dtype) and a note naming what was saved."""
    if dtype is not None and dtype not in _DTYPES:
        raise ConfigError(f"--dtype {dtype}: use one of {', '.join(_DTYPES)}.")
    base = default or base_dtype(model)
    target = _DTYPES[dtype] if dtype else base
    why = "as asked (--dtype)" if dtype else "the base model's dtype"
    return model.to(target), f"saved in {_NAMES.get(target, str(target))} ({why})"


def check_export_matches(run_path: str | Path, exported: str | Path) -> float:
    """Largest absolute logit difference between the run's model and the exported directory on a few ids."""
    from trainwise.llm.optional import require

    transformers = require("transformers", "loading the exported model")
    loaded = load_run_model(run_path)
    other = transformers.AutoModelForCausalLM.from_pretrained(str(exported), local_files_only=True).eval()
    ids = torch.arange(min(16, loaded.tokenizer.vocab_size)).unsqueeze(0) % loaded.tokenizer.vocab_size
    with torch.no_grad():
        mine = loaded.model(input_ids=ids)
        theirs = other(input_ids=ids).logits
    return float((getattr(mine, "logits", mine) - theirs).abs().max())
