"""`trainwise export RUN --to DIR`: a run's final language model as a Hugging Face model directory
(config.json + model.safetensors [+ the tokenizer]), loadable with transformers' AutoModelForCausalLM.

A Hugging Face model (model.hf / model.hf_config) is saved as it is. The built-in gpt has GPT-2's layout,
so it maps onto GPT2LMHeadModel tensor for tensor: the linear layers are stored transposed (GPT-2's Conv1D
keeps [in, out]), a model built without biases gets zero biases, and the head stays tied to the token
embedding. A byte-level tokenizer has no Hugging Face form and is left out (said in the result); a BPE
or a model directory's tokenizer is written beside the weights.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from trainwise.errors import ConfigError
from trainwise.text.chat_templates import saved_template
from trainwise.text.gpt import GPT
from trainwise.evaluate.run_model import load_run_model
from trainwise.text.tokenizer import END_OF_TEXT, BpeTokenizer, ModelTokenizer, Tokenizer

TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def gpt2_config(model: GPT, eos_id: int | None) -> Any:
    from trainwise.llm.optional import require

    transformers = require("transformers", "exporting to a Hugging Face directory")
    config = model.config
    return transformers.GPT2Config(vocab_size=config.vocab_size, n_positions=config.context, n_embd=config.width,
                                   n_layer=config.layers, n_head=config.heads, activation_function="gelu_new",
                                   resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=config.dropout,
                                   layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=eos_id,
                                   eos_token_id=eos_id)


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The built-in gpt's weights under GPT2LMHeadModel's names and layouts."""
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
    return state


def as_hugging_face(model: GPT, eos_id: int | None) -> torch.nn.Module:
    from trainwise.llm.optional import require

    transformers = require("transformers", "exporting to a Hugging Face directory")
    exported = transformers.GPT2LMHeadModel(gpt2_config(model, eos_id))
    missing, unexpected = exported.load_state_dict(gpt2_state_dict(model), strict=False)
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
    own = base_dtype(model)
    if isinstance(model, GPT):
        model = as_hugging_face(model, loaded.tokenizer.eos_id)
    model, precision_note = merged_model(model, merge_in, dtype) if merge else saved_in(model, dtype, own)
    partial = to.with_name(to.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial), safe_serialization=True)
    tokenizer_note = _save_tokenizer(loaded.tokenizer, partial)
    template = saved_template(loaded.run.tokenizer_dir(), loaded.tokenizer)
    if getattr(template, "jinja", "") and "saved" in tokenizer_note.split()[0]:
        # the built-in template the data was rendered with, in the form transformers' apply_chat_template reads
        (partial / "chat_template.jinja").write_text(template.jinja)
        tokenizer_note += f", with the {template.name} chat template"
    if to.exists():
        to.rmdir()
    partial.rename(to)
    return {"directory": str(to), "architecture": type(model).__name__, "tokenizer": tokenizer_note,
            "weights": precision_note}


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


def _save_tokenizer(tokenizer: Tokenizer, directory: Path) -> str:
    if isinstance(tokenizer, ModelTokenizer):
        tokenizer.backend.save_pretrained(str(directory))
        return "saved (the model directory's tokenizer)"
    if isinstance(tokenizer, BpeTokenizer):
        from trainwise.llm.optional import require

        transformers = require("transformers", "exporting a tokenizer")
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend, eos_token=END_OF_TEXT,
                                                    bos_token=END_OF_TEXT, pad_token=END_OF_TEXT)
        fast.save_pretrained(str(directory))
        return "saved (the BPE trained by trainwise prepare)"
    return ("not saved: byte-level ids (UTF-8 bytes 0..255, end of text 256) have no Hugging Face tokenizer; "
            "encode text as list(text.encode('utf-8'))")


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
