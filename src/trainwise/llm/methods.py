"""How much of a language model trains: `model.method` = full | freeze | lora | qlora, gradient checkpointing,
and the total vs trainable parameter counts users read.

    model = apply_method(model, "lora", lora=LoraSettings(rank=16))    # peft's get_peft_model (all-linear)
    enable_gradient_checkpointing(model)                                # HF models and the built-ins
    counts = parameter_counts(model)                                    # ParameterCounts(total, trainable)

`apply_method` works on the meta device too (the planner wraps meta-built models before tracing them).
QLoRA needs CUDA and bitsandbytes; elsewhere it is refused with the reason (`qlora_unavailable_reason`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainwise.errors import ConfigError, TrainwiseWarning
from trainwise.llm.optional import available, require

if TYPE_CHECKING:
    from torch import nn

Method = Literal["full", "freeze", "lora", "qlora"]
METHODS = ("full", "freeze", "lora", "qlora")


@dataclass(frozen=True)
class LoraSettings:
    """model.lora: the adapter's rank, scale (alpha / rank), dropout and the layers it wraps."""
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.05
    target_modules: "str | list[str]" = "all-linear"

    @classmethod
    def from_config(cls, value: Any) -> "LoraSettings":
        """From the config's `model.lora` (a pydantic section, a dict, or None for the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, LoraSettings):
            return value
        fields = value if isinstance(value, dict) else value.model_dump()
        return cls(**{k: fields[k] for k in ("rank", "alpha", "dropout", "target_modules") if k in fields})


@dataclass(frozen=True)
class ParameterCounts:
    total: int       # every parameter once (tied weights once; a 4-bit weight counts its unpacked elements)
    trainable: int   # those with requires_grad

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


def apply_method(model: "nn.Module", method: Method, *, trainable_blocks: int = 2,
                 lora: LoraSettings | None = None, device: Any = None) -> "nn.Module":
    """The model with `method` applied; may return a wrapper (peft) — use the returned module."""
    if method == "full":
        model.requires_grad_(True)
        return model
    if method == "freeze":
        return freeze_all_but_last(model, trainable_blocks)
    if method == "lora":
        return add_lora(model, lora or LoraSettings())
    if method == "qlora":
        reason = qlora_unavailable_reason(device)
        if reason:
            raise ConfigError(f"model.method=qlora cannot train here: {reason}. Use model.method=lora (same "
                              f"adapters on unquantised weights), or run on a CUDA GPU with bitsandbytes installed.")
        return add_lora(quantize_4bit(model), lora or LoraSettings())
    raise ConfigError(f"model.method={method!r}: use one of {', '.join(METHODS)}")


def transformer_blocks(model: "nn.Module") -> "nn.ModuleList":
    """The model's stack of transformer blocks: its ModuleList holding the most parameters."""
    from torch import nn
    best, best_size = None, -1
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            size = sum(p.numel() for p in module.parameters())
            if size > best_size:
                best, best_size = module, size
    if best is None:
        raise ConfigError(f"model.method=freeze: {type(model).__name__} has no list of blocks (nn.ModuleList) to "
                          f"train the last of; use model.method=full or lora")
    return best


def output_head(model: "nn.Module") -> "nn.Module | None":
    """The layer producing the logits (HF's output embeddings, or a module named lm_head / head)."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    for name in ("lm_head", "head"):
        if head is None:
            head = getattr(model, name, None)
    return head


def freeze_all_but_last(model: "nn.Module", trainable_blocks: int) -> "nn.Module":
    """Train only the last `trainable_blocks` blocks and the output head (when the head is tied to the input
    embedding, that shared table trains too)."""
    blocks = transformer_blocks(model)
    if not 1 <= trainable_blocks <= len(blocks):
        raise ConfigError(f"model.trainable_blocks={trainable_blocks}: the model has {len(blocks)} blocks; give "
                          f"1..{len(blocks)}")
    model.requires_grad_(False)
    for block in list(blocks)[-trainable_blocks:]:
        block.requires_grad_(True)
    head = output_head(model)
    if head is not None:
        head.requires_grad_(True)
    return model


def _is_hf(model: "nn.Module") -> bool:
    return any(cls.__name__ == "PreTrainedModel" for cls in type(model).__mro__)


def linear_layer_names(model: "nn.Module") -> list[str]:
    """Leaf names of the Linear layers a LoRA adapter wraps under all-linear: every nn.Linear but the head."""
    from torch import nn
    head = output_head(model)
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, nn.Linear) and module is not head})


def add_lora(model: "nn.Module", settings: LoraSettings) -> "nn.Module":
    """peft's LoRA around the target layers; every base weight frozen. Returns the PeftModel."""
    peft = require("peft", "model.method=lora")
    targets = settings.target_modules
    if targets == "all-linear" and not _is_hf(model):
        targets = linear_layer_names(model)  # peft expands all-linear for transformers models only
    if not targets:
        raise ConfigError(f"model.method=lora: {type(model).__name__} has no Linear layers to adapt")
    dropout = settings.dropout
    if dropout and _has_fused_experts(model):
        # peft adapts a mixture-of-experts model's fused expert weights (one tensor for all experts) as
        # parameters, where it has no dropout; the adapters train as asked otherwise
        warnings.warn(f"LoRA dropout {dropout} left out: peft adapts the fused expert weights of "
                      f"{type(model).__name__} without dropout (set model.lora.dropout=0 to say so, or target "
                      "the attention layers only with model.lora.target_modules).", TrainwiseWarning, stacklevel=2)
        dropout = 0.0
    # GPT-2's projections are transformers' Conv1D (weights stored transposed): said to peft, which otherwise
    # warns once per adapted layer and sets it itself
    transposed = any(type(module).__name__ == "Conv1D" for module in model.modules())
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=dropout, target_modules=targets,
                             task_type="CAUSAL_LM" if _is_hf(model) else None, fan_in_fan_out=transposed)
    try:
        return _peft_model(peft, model, config)
    except ValueError as exc:
        raise ConfigError(f"model.lora.target_modules={settings.target_modules!r}: {exc}") from None


def _has_fused_experts(model: "nn.Module") -> bool:
    """A mixture-of-experts block that keeps all experts' weights in one 3-D tensor (transformers 5)."""
    return any(type(module).__name__.endswith("Experts") and any(p.dim() == 3 for p in module.parameters(False))
               for module in model.modules())


def _peft_model(peft: Any, model: "nn.Module", config: Any) -> "nn.Module":
    with warnings.catch_warnings():  # peft 0.21 asks transformers 5 for a renamed flag: noise in every run's log
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return peft.get_peft_model(model, config)


def qlora_unavailable_reason(device: Any = None) -> str | None:
    """Why 4-bit QLoRA cannot train here (no CUDA, a non-CUDA device, no bitsandbytes), or None when it can."""
    import torch
    if device is not None and torch.device(device).type not in ("cuda", "meta"):
        return f"4-bit weights (bitsandbytes NF4) train on CUDA GPUs only, and this run is on {device}"
    if not torch.cuda.is_available():
        return "4-bit weights (bitsandbytes NF4) train on CUDA GPUs only, and no CUDA GPU is visible"
    if not available("bitsandbytes"):
        return "the bitsandbytes package is not installed (pip install bitsandbytes)"
    return None


def quantize_4bit(model: "nn.Module", compute_dtype: Any = None) -> "nn.Module":
    """Replace every Linear but the head by bitsandbytes' NF4 Linear4bit (weights quantise on `.cuda()`), then
    prepare the model for k-bit training (peft). Needs CUDA + bitsandbytes (checked by the caller)."""
    import torch
    from torch import nn
    bnb = require("bitsandbytes", "model.method=qlora")
    peft = require("peft", "model.method=qlora")
    compute_dtype = compute_dtype or torch.bfloat16
    head = output_head(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child is not head:
                quantised = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                              compute_dtype=compute_dtype, quant_type="nf4")
                quantised.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4")
                if child.bias is not None:
                    quantised.bias = nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, quantised)
    model = model.cuda()
    return peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def find_peft_model(model: "nn.Module") -> Any | None:
    """The peft wrapper inside `model` (itself, or a submodule: a trainwise wrapper around it), or None.
    peft is never imported here: a model can only hold one if peft is already loaded."""
    import sys

    peft = sys.modules.get("peft")
    if peft is None:
        return None
    return next((m for m in model.modules() if isinstance(m, peft.PeftModel)), None)


def wrapped_model(model: "nn.Module") -> "nn.Module":
    """The model a peft wrapper holds (whose forward runs the blocks), or `model` itself. Switches such as
    `gradient_checkpointing` are set there: set on the wrapper, they would shadow the inner model's and do nothing."""
    peft_model = find_peft_model(model)
    return peft_model.get_base_model() if peft_model is not None else model


def enable_gradient_checkpointing(model: "nn.Module") -> bool:
    """Recompute activations in backward: `activation_checkpointing_enable` on Hugging Face models (also inside
    a peft wrapper), the `gradient_checkpointing` attribute on trainwise's built-ins. False if the model has
    neither (the caller says so)."""
    model = wrapped_model(model)
    hf_enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5
    legacy_enable = getattr(model, "gradient_checkpointing_enable", None)  # transformers 4
    if callable(hf_enable):
        hf_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif callable(legacy_enable):
        legacy_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if callable(hf_enable) or callable(legacy_enable):
        if getattr(getattr(model, "config", None), "use_cache", None):
            model.config.use_cache = False  # a KV cache is useless in training and clashes with recomputation
        return True
    if hasattr(model, "gradient_checkpointing"):
        model.gradient_checkpointing = True
        return True
    return False


def gradient_checkpointing_enabled(model: "nn.Module") -> bool:
    """Whether the model (HF or built-in, wrapped or not) recomputes activations in backward."""
    model = wrapped_model(model)
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # transformers 5, then 4
        flag = getattr(model, name, None)
        if isinstance(flag, bool):
            return flag
    return bool(getattr(model, "gradient_checkpointing", False))


def parameter_counts(model: "nn.Module") -> ParameterCounts:
    """Total and trainable parameters, tied weights once, 4-bit weights by their unpacked element count."""
    total = trainable = 0
    for parameter in model.parameters():  # parameters() yields a tied tensor once
        state = getattr(parameter, "quant_state", None)
        count = int(_numel(state.shape)) if state is not None else parameter.numel()
        total += count
        trainable += count if parameter.requires_grad else 0
    return ParameterCounts(total, trainable)


def _numel(shape) -> int:
    out = 1
    for size in shape:
        out *= int(size)
    return out


def apply_model_config(model: "nn.Module", model_config: Any, device: Any = None) -> "nn.Module":
    """Apply a config's model section (method, trainable_blocks, lora, gradient_checkpointing) to `model`;
    the one call the engine and the planner make. Returns the (possibly wrapped) model."""
    model = apply_method(model, getattr(model_config, "method", "full") or "full",
                         trainable_blocks=getattr(model_config, "trainable_blocks", 2),
                         lora=LoraSettings.from_config(getattr(model_config, "lora", None)), device=device)
    if holds_master_weights(model_config):
        keep_fp32_master_weights(model)
    if getattr(model_config, "gradient_checkpointing", False):
        enable_gradient_checkpointing(model)
    return model


def holds_master_weights(model_config: Any) -> bool:
    """Full fine-tuning of bf16 weights keeps fp32 master weights (model.master_weights=fp32, the default)."""
    return (getattr(model_config, "method", "full") == "full" and getattr(model_config, "dtype", "fp32") == "bf16"
            and getattr(model_config, "master_weights", "fp32") == "fp32")


def keep_fp32_master_weights(model: "nn.Module") -> None:
    """The trained parameters held in fp32 (the optimizer steps them there: an update smaller than bf16's
    resolution is kept), while the trainer computes under bf16 autocast. In place, so DDP, FSDP2 and
    checkpoints see ordinary fp32 parameters."""
    import torch

    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype == torch.bfloat16:
            parameter.data = parameter.data.float()
