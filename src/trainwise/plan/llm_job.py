"""A language-model plan's job is a RunConfig: `trainwise plan MODEL --method lora ...` is spelling for
`model.hf_config=MODEL model.method=lora ...` (dotted overrides are accepted beside the flags), and a recipe whose
model.hf / model.hf_config names a language model is the same job. `lm_job_from_config` is the one reading of
such a config into the traced job (LmJob), so `plan sft-lora model.hf_config=M` and `plan M --method lora` agree.

Defaults as practitioners run these jobs: an adapter or a frozen base is kept in bf16 (QLoRA: 4-bit), full
fine-tuning keeps fp32 master weights under bf16 autocast (mixed precision, what `train` does); adapters train
with gradient checkpointing (the sft-lora recipe, torchtune's LoRA configs). The flags and overrides change
each (--dtype, --no-checkpointing, model.dtype=..., ...).
"""
from __future__ import annotations

from typing import Any

from trainwise.config import RunConfig
from trainwise.config.derived import text_sequence_length
from trainwise.config.load import apply_override, config_from_dict
from trainwise.data.prepared import prepared_text_manifest
from trainwise.errors import ConfigError
from trainwise.llm import methods
from trainwise.plan.llm_step import LmJob
from trainwise.runtime.precision import choose_precision

DEFAULT_SEQ_LEN = 2048
DEFAULT_BATCH = 16
PLAN_ONLY_OPTIMIZERS = ("adamw8bit",)  # planned by size (bitsandbytes); `train` has no such optimizer


def base_dtype(method: str) -> str:
    """The weights' dtype practitioners train `method` with: a frozen base (adapters, freeze) in bf16; full
    fine-tuning with fp32 master weights (bf16 autocast computes)."""
    return "fp32" if method == "full" else "bf16"


def lm_config(model: str, flags: dict[str, Any], overrides: list[str] = ()) -> RunConfig:
    """The RunConfig `trainwise plan MODEL --flags ... key=value` describes. Flags left at None keep the config's
    default; `model.dtype` follows the method (base_dtype) unless --dtype or an override sets it."""
    raw: dict[str, Any] = {"name": "plan", "model": {"name": None, "hf_config": model},
                           "data": {"name": "prepared"}, "train": {}, "optim": {}}
    spelled = {"method": ("model", "method"), "dtype": ("model", "dtype"),
               "trainable_blocks": ("model", "trainable_blocks"),
               "gradient_checkpointing": ("model", "gradient_checkpointing"),
               "loss_chunk_size": ("model", "loss_chunk_size"), "seq_len": ("data", "seq_len"),
               "batch_size": ("train", "batch_size"), "micro_batch_size": ("train", "micro_batch_size"),
               "precision": ("train", "precision"), "optimizer": ("optim", "name")}
    for flag, (section, key) in spelled.items():
        value = flags.get(flag)
        if value is not None and not (flag == "optimizer" and value in PLAN_ONLY_OPTIMIZERS):
            raw[section][key] = value
    if flags.get("lora_rank") is not None:  # alpha = 2 x rank, the usual scale
        raw["model"]["lora"] = {"rank": flags["lora_rank"], "alpha": 2.0 * flags["lora_rank"]}
    raw["data"].setdefault("seq_len", DEFAULT_SEQ_LEN)
    raw["train"].setdefault("batch_size", DEFAULT_BATCH)
    raw["train"].setdefault("micro_batch_size", "auto")  # each card: the most sequences that fit it
    raw["train"].setdefault("epochs", 1)  # the run's length is --steps or --tokens; a config needs one
    for item in overrides:
        apply_override(raw, item)
    model_section = raw.setdefault("model", {})
    method = model_section.get("method", "full")
    model_section.setdefault("dtype", base_dtype(method))
    # adapters are trained with activation checkpointing (the sft-lora recipe, torchtune's LoRA configs)
    model_section.setdefault("gradient_checkpointing", method in ("lora", "qlora"))
    return config_from_dict(raw, source=f"plan {model}")


def lm_job_from_config(config: RunConfig, optimizer: str | None = None) -> tuple[LmJob, list[str]]:
    """The language-model job a RunConfig describes (model.hf or model.hf_config set). `optimizer`: a plan-only
    optimizer (adamw8bit) in place of optim.name."""
    model, train = config.model, config.train
    spec = model.hf or model.hf_config
    check_model_fields(spec)
    notes = []
    prepared = prepared_text_manifest(config.data) if config.data.seq_len is None else None
    seq_len = text_sequence_length(None, prepared) if prepared is not None else config.data.seq_len  # as trained
    if seq_len is None:
        seq_len = DEFAULT_SEQ_LEN
        notes.append(f"data.seq_len is not set: planned at {DEFAULT_SEQ_LEN} tokens per sequence.")
    micro = None if train.micro_batch_size == "auto" else train.micro_batch
    job = LmJob(model=spec, seq_len=seq_len, batch_size=train.batch_size, micro_batch_size=micro,
                method=model.method, trainable_blocks=model.trainable_blocks,
                lora=methods.LoraSettings.from_config(model.lora),
                dtype="fp32" if methods.holds_master_weights(model)  # fp32 master weights; auto: a bf16 card's
                else base_dtype(model.method) if model.dtype == "auto" else model.dtype,
                precision=choose_precision(train.precision, "cuda", bf16_native=True),  # auto: what bf16 cards run
                optimizer=optimizer or ("adamw" if config.optim.name == "adam" else config.optim.name),
                gradient_checkpointing=model.gradient_checkpointing, loss_chunk_size=model.loss_chunk_size,
                grad_clip_norm=train.grad_clip_norm)
    check_job(job)
    return job, notes


def check_job(job: LmJob) -> None:
    if job.seq_len < 1 or job.batch_size < 1:
        raise ConfigError("--seq-len and --batch must be positive")
    if job.micro_batch_size and job.batch_size % job.micro_batch_size:
        raise ConfigError(f"--micro-batch {job.micro_batch_size} does not divide --batch {job.batch_size}")
    if job.method not in methods.METHODS:
        raise ConfigError(f"--method {job.method!r}: use one of {', '.join(methods.METHODS)}")
    if job.optimizer not in ("adamw", "adamw8bit", "sgd"):
        raise ConfigError(f"--optimizer {job.optimizer!r}: use adamw, adamw8bit or sgd")
    if job.method == "freeze" and not 1 <= job.trainable_blocks <= job.depth():
        raise ConfigError(f"--trainable-blocks {job.trainable_blocks}: the model has {job.depth()} blocks")


# the fields a plan cannot do without, by their names in each family: (what it is, the names it goes by)
REQUIRED_FIELDS = (("the width", ("hidden_size", "n_embd", "d_model")),
                   ("the number of blocks", ("num_hidden_layers", "n_layer", "num_layers")),
                   ("the number of attention heads", ("num_attention_heads", "n_head", "num_heads")),
                   ("the vocabulary size", ("vocab_size",)))


def check_model_fields(spec: str | dict) -> dict[str, Any]:
    """The model's config.json fields, refused with one message naming the field when one a plan needs is
    missing, not a positive whole number, or inconsistent (heads that do not divide the width) — never
    defaulted by transformers to another model's size."""
    from trainwise.llm import hf
    fields = hf.config_dict(spec) if isinstance(spec, str) else dict(spec)
    where = spec if isinstance(spec, str) else "the model config"
    found = {}
    for what, names in REQUIRED_FIELDS:
        name = next((n for n in names if n in fields), None)
        if name is None:
            raise ConfigError(f"{where}: no {names[0]!r} ({what}); a plan needs it and will not guess it. Add it "
                              "to config.json (the published model's config.json has it).")
        value = fields[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {name!r} is {value!r}; {what} must be a whole number of at least 1.")
        found[names[0]] = value
    if "head_dim" not in fields and found["hidden_size"] % found["num_attention_heads"]:
        raise ConfigError(f"{where}: {found['num_attention_heads']} attention heads do not divide the width "
                          f"{found['hidden_size']}; give a num_attention_heads that divides it, or head_dim.")
    if "intermediate_size" in fields and (isinstance(fields["intermediate_size"], bool)
                                          or not isinstance(fields["intermediate_size"], int)
                                          or fields["intermediate_size"] < 1):
        raise ConfigError(f"{where}: 'intermediate_size' is {fields['intermediate_size']!r}; it must be a whole "
                          "number of at least 1.")
    return fields


def job_notes(job: LmJob) -> list[str]:
    notes = []
    if job.method == "qlora":
        notes.append("QLoRA is planned by size (NF4 weights with double quantisation, dequantised per layer in "
                     "forward and backward); training it needs a CUDA GPU with bitsandbytes.")
    if job.optimizer == "adamw8bit":
        notes.append("8-bit AdamW is planned by the size of bitsandbytes' state (1 byte per moment per weight + "
                     "a 4-byte scale per 256); it needs bitsandbytes on a CUDA GPU.")
    return notes
