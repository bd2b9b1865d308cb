"""The language-model job a RunConfig describes (model.hf or model.hf_config set): job.job_from_config's one
language-model branch reads it here into an LmJob, the form the planner traces (two depths extended to the real
one, llm_estimate.py) and the levers change (advise_levers.py). `trainwise plan MODEL --method lora ...` is
spelling for `model.hf_config=MODEL model.method=lora ...` (cli/plan.py turns the flags into these dotted keys;
`model_config` fills what a model named alone leaves open), so `plan sft-lora model.hf_config=M` and
`plan M --method lora` are one job.

Defaults for a model named alone, as practitioners run these jobs: an adapter or a frozen base is kept in bf16
(QLoRA: 4-bit), full fine-tuning keeps fp32 weights under bf16 autocast (mixed precision, what `train` does);
adapters train with gradient checkpointing (the sft-lora recipe, torchtune's LoRA configs). Any key set by a
flag or an override wins.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trainwise.config import RunConfig
from trainwise.config.derived import text_sequence_length
from trainwise.config.load import apply_override, config_from_dict
from trainwise.data.prepared import prepared_text_manifest
from trainwise.errors import ConfigError
from trainwise.llm import hf, methods
from trainwise.runtime.precision import choose_precision
from trainwise.train.step.master_weights import computing_precision

DEFAULT_SEQ_LEN = 2048
DEFAULT_BATCH = 16
PLAN_ONLY_OPTIMIZERS = ("adamw8bit",)  # planned by size (bitsandbytes); `train` has no such optimizer


@dataclass(frozen=True)
class LmJob:
    """A language-model training job as the planner traces it. It has no defaults of its own: it is read from a
    RunConfig (`language_model_job`), whose schema and `plan`'s flags hold them."""

    model: str | dict  # catalogue name, config.json path, model directory, or config fields
    seq_len: int
    batch_size: int  # sequences per optimizer step
    micro_batch_size: int | None  # None: the whole batch at once
    method: str
    trainable_blocks: int
    lora: methods.LoraSettings
    dtype: str  # weights (and so optimizer state): fp32 (master weights) or bf16
    precision: str  # what the step computes in on a card with bf16 (the runtime's rule): traced so
    optimizer: str  # adamw | adamw8bit | sgd
    gradient_checkpointing: bool
    loss_chunk_size: int | None
    grad_clip_norm: float | None
    overrides: dict[str, Any] = field(default_factory=dict)  # config fields replaced (e.g. a smaller model)
    # what it computes in on a card without bf16 (a T4, a V100); None: the run refuses there (bf16 asked)
    precision_without_bf16: str | None = "fp16"
    notes: tuple[str, ...] = ()

    @property
    def micro(self) -> int:
        return self.micro_batch_size or self.batch_size

    def config(self, layers: int | None = None):
        """The transformers config, with `layers` blocks when given."""
        overrides = dict(self.overrides)
        if layers is not None:
            overrides[layer_field(self.model_fields())] = layers
        return hf.resolve_config(self.model, **overrides)

    def model_fields(self) -> dict[str, Any]:
        fields = hf.config_dict(self.model) if isinstance(self.model, str) else dict(self.model)
        return {**fields, **self.overrides}

    def depth(self) -> int:
        return int(self.model_fields()[layer_field(self.model_fields())])

    def with_changes(self, **changes: Any) -> "LmJob":
        return replace(self, **changes)


def layer_field(fields: dict[str, Any]) -> str:
    """The config field holding the number of blocks (GPT-2 calls it n_layer)."""
    return "n_layer" if "n_layer" in fields else "num_hidden_layers"


def is_language_model(config: RunConfig) -> bool:
    """The one test of which branch plans a config: a Hugging Face language model (model.hf or model.hf_config)."""
    return bool(config.model.hf or config.model.hf_config)


def base_dtype(method: str) -> str:
    """The weights' dtype practitioners train `method` with: a frozen base (adapters, freeze) in bf16; full
    fine-tuning with fp32 weights (bf16 autocast computes)."""
    return "fp32" if method == "full" else "bf16"


def model_config(model: str, overrides: list[str] = ()) -> RunConfig:
    """The RunConfig `trainwise plan MODEL key=value ...` describes: model.hf_config=MODEL, and for what the
    overrides leave open the module's defaults (a batch of 16 x 2,048 tokens, each card's largest micro-batch,
    the method's usual dtype and checkpointing)."""
    raw: dict[str, Any] = {"name": "plan", "model": {"name": None, "hf_config": model},
                           "data": {"name": "prepared", "seq_len": DEFAULT_SEQ_LEN},
                           "train": {"batch_size": DEFAULT_BATCH, "micro_batch_size": "auto", "epochs": 1},
                           "optim": {}}
    for item in overrides:
        apply_override(raw, item)
    model_section = raw.setdefault("model", {})
    method = model_section.get("method", "full")
    model_section.setdefault("dtype", base_dtype(method))
    model_section.setdefault("gradient_checkpointing", method in ("lora", "qlora"))
    return config_from_dict(raw, source=f"plan {model}")


def language_model_job(config: RunConfig) -> LmJob:
    """The language-model job `config` describes. Precision: the runtime's rule (choose_precision) on a card with bf16 and on one without, and
    fp32 master weights computing under bf16 (computing_precision), as the run resolves it."""
    model, train = config.model, config.train
    spec = model.hf or model.hf_config
    check_model_fields(spec)
    notes = []
    prepared = prepared_text_manifest(config.data) if config.data.seq_len is None else None
    seq_len = text_sequence_length(None, prepared) if prepared is not None else config.data.seq_len  # as trained
    if seq_len is None:
        seq_len = DEFAULT_SEQ_LEN
        notes.append(f"data.seq_len is not set: planned at {DEFAULT_SEQ_LEN} tokens per sequence.")
    job = LmJob(model=spec, seq_len=seq_len, batch_size=train.batch_size,
                micro_batch_size=None if train.micro_batch_size == "auto" else train.micro_batch,
                method=model.method, trainable_blocks=model.trainable_blocks,
                lora=methods.LoraSettings.from_config(model.lora),
                dtype="fp32" if methods.holds_master_weights(model)  # fp32 master weights; auto: a bf16 card's
                else base_dtype(model.method) if model.dtype == "auto" else model.dtype,
                precision=computed_precision(config, bf16_native=True),
                precision_without_bf16=computed_precision(config, bf16_native=False),
                optimizer="adamw" if config.optim.name == "adam" else config.optim.name,
                gradient_checkpointing=model.gradient_checkpointing, loss_chunk_size=model.loss_chunk_size,
                grad_clip_norm=train.grad_clip_norm, notes=tuple(notes))
    check_job(job)
    return job


def computed_precision(config: RunConfig, bf16_native: bool) -> str | None:
    """What the run computes in on a CUDA card with (or without) bf16; None where it refuses to run."""
    try:
        precision = choose_precision(config.train.precision, "cuda", bf16_native=bf16_native)
    except ConfigError:
        return None
    return computing_precision(precision, config.model)


def check_job(job: LmJob) -> None:
    """What the schema cannot check without the model (batch, micro-batch, method and optimizer it has): the
    blocks `freeze` trains exist."""
    if job.method == "freeze" and not 1 <= job.trainable_blocks <= job.depth():
        raise ConfigError(f"model.trainable_blocks={job.trainable_blocks} (--trainable-blocks): the model has "
                          f"{job.depth()} blocks; train between 1 and {job.depth()} of them.")


# the fields a plan cannot do without, by their names in each family: (what it is, the names it goes by)
REQUIRED_FIELDS = (("the width", ("hidden_size", "n_embd", "d_model")),
                   ("the number of blocks", ("num_hidden_layers", "n_layer", "num_layers")),
                   ("the number of attention heads", ("num_attention_heads", "n_head", "num_heads")),
                   ("the vocabulary size", ("vocab_size",)))


def check_model_fields(spec: str | dict) -> dict[str, Any]:
    """The model's config.json fields, refused with one message naming the field when one a plan needs is
    missing, not a positive whole number, or inconsistent (heads that do not divide the width) — never
    defaulted by transformers to another model's size."""
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


def method_notes(job: LmJob) -> list[str]:
    notes = []
    if job.method == "qlora":
        notes.append("QLoRA is planned by size (NF4 weights with double quantisation, dequantised per layer in "
                     "forward and backward); training it needs a CUDA GPU with bitsandbytes.")
    if job.optimizer == "adamw8bit":
        notes.append("8-bit AdamW is planned by the size of bitsandbytes' state (1 byte per moment per weight + "
                     "a 4-byte scale per 256); it needs bitsandbytes on a CUDA GPU.")
    return notes
