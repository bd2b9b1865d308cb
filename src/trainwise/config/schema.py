"""The whole description of a run: one pydantic model with a section per concern, data only.

Every field carries a description; the CLI and the error messages quote them (messages.py). Recipes are YAML
files of this shape, read by load.py; the command line overrides any field with a dotted key:
`optim.lr=3e-4 train.max_steps=200`. Numbers derived from a config (accumulation steps, warmup steps, which
way a metric improves) are derived.py's.
"""
from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainwise.config.derived import accumulation_steps, metric_mode, micro_batch_at_most
from trainwise.errors import ConfigError, DataError


# A ceiling no machine reaches (the largest hosts have a few hundred cores); the real bound, cores x
# `WORKERS_PER_CORE`, depends on the machine and is checked where the loader starts its workers, because a
# run's config.yaml must stay readable on a smaller machine.
MAX_NUM_WORKERS = 1024


MAX_SEED = 2**32 - 1
# Faster than this the sampler competes with training for the GIL; slower than an hour it records nothing
# useful, and Event.wait overflows on huge timeouts (which killed the telemetry thread).
MIN_TELEMETRY_INTERVAL_S, MAX_TELEMETRY_INTERVAL_S = 0.05, 3600.0
_TRAINING_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d{1,3})?)$")


class Section(BaseModel):
    # No field means anything at inf or nan (`train.epochs=.inf` overflowed when counting steps); None is
    # how a field says "no limit"
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraConfig(Section):
    rank: int = Field(16, gt=0, description="LoRA rank r: the width of the low-rank update of each adapted layer.")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha: the update is scaled by alpha / rank.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA branch's input.")
    target_modules: str | list[str] = Field("all-linear", description="Layers that get adapters: `all-linear` "
                                            "(every linear layer but the output head) or a list of module names "
                                            "(e.g. [q_proj, v_proj]).")


class ModelConfig(Section):
    name: str | None = Field("mlp", description="Built-in model: `cnn` (images), `mlp` (tables), `gpt` (a "
                             "decoder-only language model), or a recommender (`sasrec`, `gru4rec`, `popularity`, "
                             "`din`). Ignored when `factory`, `hf` or `hf_config` is set.")
    factory: str | None = Field(None, description="Your own model as `package.module:function`; it is called "
                                "with `args` (and `data_spec=` when it accepts it) and returns an nn.Module.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the model builder "
                                 "(built-ins: hidden sizes, `dropout`, ...).")
    hf: str | None = Field(None, description="A local Hugging Face causal language model directory (config.json "
                           "and *.safetensors, with its tokenizer) to fine-tune or continue pretraining. Needs "
                           "`pip install 'trainwise[llm]'`.")
    hf_config: str | None = Field(None, description="A language model initialised at random from a config: a "
                                  "catalogue name (`trainwise plan --list-models`, e.g. llama-3.2-1b) or a "
                                  "config.json (or a directory holding one). Needs `pip install 'trainwise[llm]'`.")
    method: Literal["full", "freeze", "lora", "qlora"] = Field("full", description="What trains: `full` (every "
                                                               "weight), `freeze` (the last `trainable_blocks` "
                                                               "blocks and the head), `lora` (low-rank adapters, "
                                                               "see `lora`), `qlora` (adapters on a 4-bit base; "
                                                               "CUDA and bitsandbytes only).")
    trainable_blocks: int = Field(2, ge=0, description="method=freeze: how many of the last blocks train, with "
                                  "the output head.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="The LoRA adapters, when `method: lora`.")
    dtype: Literal["auto", "fp32", "bf16"] = Field("fp32", description="Weight dtype: `fp32` master weights "
                                                   "(mixed precision comes from train.precision), `bf16` (pure "
                                                   "bf16 weights and optimizer state: half the memory, less exact "
                                                   "updates) or `auto`: bf16 where the device computes bf16 "
                                                   "natively (a CUDA card, Ampere or newer), fp32 elsewhere (on a "
                                                   "CPU bf16 weights were no faster, often slower); the run "
                                                   "records its choice.")
    master_weights: Literal["fp32", "none"] = Field("fp32", description="method=full with model.dtype=bf16: "
                                                    "`fp32` keeps the trained weights in fp32 (master weights) "
                                                    "and computes under bf16 autocast, so small updates are kept; "
                                                    "`none` trains the bf16 weights themselves (less memory; "
                                                    "updates below bf16's resolution are lost, and the run warns "
                                                    "with the share lost on its first step).")
    loss_chunk_size: int | None = Field(None, gt=0, description="Language models: compute the output layer and "
                                        "cross-entropy this many tokens at a time, so the [tokens x vocabulary] "
                                        "logits never exist at once (None: all at once).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory "
                                         "(built-in models: torch.utils.checkpoint, use_reentrant=False; Hugging "
                                         "Face models: gradient_checkpointing_enable()).")
    compile: bool = Field(False, description="Wrap the model in torch.compile.")
    attention: Literal["auto", "flash_attention_3", "flash_attention_2", "flex_attention", "sdpa", "eager"] = Field(
        "auto", description="Hugging Face models: the attention implementation. `auto` takes the best this machine "
        "runs: on CUDA `flash_attention_3` or `flash_attention_2` where installed, else `flex_attention`, else "
        "`sdpa`; on the CPU `sdpa`, or `eager` for families without it. The run records the one it chose here, so "
        "a resume runs the same.")

    @model_validator(mode="after")
    def _one_language_model_source(self) -> "ModelConfig":
        if self.hf is not None and self.hf_config is not None:
            raise ValueError("set model.hf (a model directory with weights) or model.hf_config (a config to "
                             "initialise at random), not both")
        return self


class DataConfig(Section):
    name: str | None = Field("digits", description="Built-in data set: `digits`, `breast_cancer`, or "
                             "`prepared` (a directory written by `trainwise prepare`, see `path`).")
    factory: str | None = Field(None, description="Your own data as `package.module:function` returning a "
                                "trainwise.DataBundle; called with `args` and `seed=`.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the data builder.")
    path: str | None = Field(None, description="Prepared dataset directory (from `trainwise prepare`).")
    val_fraction: float = Field(0.15, ge=0.0, lt=1.0, description="Share of the data held out for validation.")
    test_fraction: float = Field(0.15, ge=0.0, lt=1.0, description="Share held out for the final test.")
    augment: bool = Field(False, description="Random training-time augmentation (built-in data: small shifts "
                          "for images, feature noise for tables).")
    num_workers: int | Literal["auto"] = Field(0, description="DataLoader worker processes (0: load in the "
                                               "training process); `auto` sizes them from the usable cores, RAM "
                                               "and /dev/shm. At most 2 per usable core.")
    pin_memory: bool | Literal["auto"] = Field("auto", description="Pin host memory for faster copies to GPU "
                                               "(`auto`: when training on a GPU).")
    seq_len: int | None = Field(None, gt=0, description="Text data: tokens per training sequence (None: the "
                                "context length `trainwise prepare` suggested for the corpus).")

    @field_validator("num_workers")
    @classmethod
    def _workers_in_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"{value} workers: give 0 (load in the training process), a positive count, or "
                             "auto")
        if isinstance(value, int) and value > MAX_NUM_WORKERS:
            raise ValueError(f"{value} worker processes would fork until the machine runs out of memory; use at "
                             "most 2 per usable core (data.num_workers=auto picks for you)")
        return value

    @model_validator(mode="after")
    def _fractions_leave_training_data(self) -> "DataConfig":
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(f"val_fraction + test_fraction = {self.val_fraction + self.test_fraction:g} "
                             "leaves under 10% for training; keep their sum below 0.9")
        return self


Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimConfig(Section):
    name: Literal["adamw", "adam", "sgd"] = Field("adamw", description="Optimizer: `adamw`, `adam` or `sgd`.")
    # The ranges torch's optimizers accept, checked here so a bad value is refused before data is loaded
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (after warmup).")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (adamw) or L2 (adam, sgd).")
    betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="Adam betas, each in [0, 1).")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum.")


class ScheduleConfig(Section):
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warmup from 0 to `optim.lr`.")
    warmup_fraction: float | None = Field(None, ge=0, lt=1, description="Warmup as a share of all steps "
                                          "(replaces warmup_steps when set).")
    decay: Literal["cosine", "linear", "constant"] = Field("cosine", description="LR shape after warmup: "
                                                           "`cosine`, `linear` or `constant`.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final LR as a share of the peak.")


class TrainConfig(Section):
    max_steps: int | None = Field(None, gt=0, description="Optimizer steps to run (wins over epochs).")
    epochs: float | None = Field(None, gt=0, description="Passes over the training data, when max_steps "
                                 "is not set.")
    batch_size: int = Field(32, gt=0, description="Effective batch: samples per optimizer step.")
    micro_batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] | None = Field(
        None, description="Samples per forward/backward on each rank; batch_size / (micro_batch_size × ranks) "
        "micro-batches are accumulated. Default: the batch split over the ranks (batch_size in one process). "
        "`auto`: when the run starts, the largest divisor of the per-rank batch "
        "whose planned peak memory (`trainwise plan`'s trace of the step) fits the memory free on the device less "
        "a safety margin; the choice and its numbers are an event, config.yaml records the number.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field("auto", description="`auto`: bf16 where the "
                                                                "device supports it, fp16 on older CUDA cards, "
                                                                "fp32 otherwise.")
    device: str = Field("auto", description="`auto` (cuda > mps > cpu), `cpu`, `cuda`, `cuda:N` or `mps`.")
    grad_clip_norm: float | None = Field(1.0, gt=0, description="Clip the global gradient norm to this "
                                         "(None: no clipping; the norm is logged either way).")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="Label smoothing for classification loss.")
    log_every: int = Field(10, gt=0, description="Optimizer steps between metric lines (and device syncs).")
    tf32: bool = Field(True, description="Allow TF32 matmuls on Ampere and newer cards in fp32.")
    sanity: bool = Field(True, description="Run the sanity checks (`trainwise check`) before training: labels, "
                         "inputs, train/test leakage, an overfit-one-batch probe; an error stops the run.")
    oom_policy: Literal["recover", "fail"] = Field("recover", description="On out-of-memory in a step: "
                                                   "`recover` halves the micro-batch (accumulating more, so the "
                                                   "effective batch is unchanged) and retries the same samples, "
                                                   "then tries gradient checkpointing; `fail` stops.")
    strategy: Literal["auto", "single", "ddp", "fsdp"] = Field(
        "auto", description="How the ranks of a torchrun job share the model. `single`: one process; `ddp`: a "
        "full copy per rank, gradients all-reduced; `fsdp`: FSDP2, parameters, gradients and optimizer state "
        "sharded block by block (your model's `fsdp_blocks()` method, when it has one, returns the modules to "
        "shard), sharded checkpoints (these also resume on a different number of ranks). `auto`: single for one "
        "process, ddp for several.")
    fsdp_cpu_offload: bool = Field(False, description="Under fsdp on GPUs: keep the sharded parameters, gradients "
                                   "and optimizer state in CPU memory (slower; for models that do not fit otherwise).")
    dist_timeout_s: float = Field(600.0, gt=0, le=7 * 24 * 3600, description="Seconds a rank waits in a "
                                  "collective for the others (a dead or stuck rank) before the run fails "
                                  "instead of hanging.")

    @property
    def micro_batch(self) -> int:
        """The micro-batch as a number: the whole batch when none is set or when `auto` is not resolved yet
        (the planner and the loader bench size for that; `trainwise train` resolves `auto` before training)."""
        return self.micro_batch_size if isinstance(self.micro_batch_size, int) else self.batch_size

    def refuse_unresolved_auto(self) -> None:
        """`auto` is the planner's call, made by launch/'s resolve step before the engine is built (the engine
        does not import the planner)."""
        if self.micro_batch_size == "auto":
            raise ConfigError("train.micro_batch_size=auto is chosen by the planner when a run starts: start it "
                              "with `trainwise train` or trainwise.launch.train_run (they resolve it), or set a "
                              "number.")

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step in one process (derived.accumulation_steps)."""
        return accumulation_steps(self.batch_size, self.micro_batch)

    @property
    def sharded_checkpoints(self) -> bool:
        """Whether the run's checkpoints are sharded directories (fsdp, also in one process) or files."""
        return self.strategy == "fsdp"

    def micro_batch_for(self, ranks: int) -> int:
        """Samples per forward on each of `ranks` ranks: the micro-batch set, or when none is set (or `auto`
        is not resolved yet) the global batch split over the ranks. Every rank takes the same share of each
        optimizer step, so a batch the ranks cannot share evenly is refused (ConfigError) with the sizes
        that work."""
        if ranks <= 1:
            return self.micro_batch
        if self.batch_size % ranks:
            lower, higher = self.batch_size - self.batch_size % ranks, self.batch_size + ranks - self.batch_size % ranks
            near = f"{lower} or {higher}" if lower else f"{higher}"
            raise ConfigError(f"train.batch_size ({self.batch_size}) cannot be split evenly over {ranks} ranks (each "
                              f"rank takes the same share of every optimizer step); use train.batch_size={near}, "
                              f"or another multiple of {ranks}.")
        share = self.batch_size // ranks
        if not isinstance(self.micro_batch_size, int):
            return share
        if share % self.micro_batch_size:
            fits = micro_batch_at_most(share, self.micro_batch_size)
            raise ConfigError(f"train.micro_batch_size ({self.micro_batch_size}) does not divide each rank's share "
                              f"of the batch (train.batch_size {self.batch_size} / {ranks} ranks = {share}): use "
                              f"train.micro_batch_size={fits}, or leave it unset (each rank then takes its whole "
                              "share at once).")
        return self.micro_batch_size

    def accumulation_steps_for(self, ranks: int) -> int:
        """Micro-batches each rank accumulates per optimizer step on `ranks` ranks."""
        return accumulation_steps(self.batch_size, self.micro_batch_for(ranks), max(ranks, 1))

    def steps_per_epoch(self, num_train: int) -> int:
        """Optimizer steps in one pass over `num_train` samples. The last partial batch is dropped (every step
        sees `batch_size` samples), so this rounds down: the trainer runs this many and the plan prices them."""
        steps = num_train // self.batch_size
        if steps == 0:
            raise DataError(f"the training split has {num_train} samples, fewer than one batch "
                            f"(train.batch_size={self.batch_size}); lower the batch size.")
        return steps

    def total_steps(self, num_train: int) -> int:
        """Optimizer steps of the whole run: `max_steps`, else `epochs` passes (a fraction of a pass rounds up)."""
        return self.max_steps or math.ceil(self.epochs * self.steps_per_epoch(num_train))

    @field_validator("micro_batch_size", mode="before")
    @classmethod
    def _micro_batch_number_or_auto(cls, value: Any) -> Any:
        if value is None or value == "auto":
            return value
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or int(text) == 0:
            raise ValueError(f"{value!r} is not a micro-batch size; use a positive whole number of samples, or "
                             "`auto` (the largest that fits the memory free on the device)")
        return int(text)

    @field_validator("device")
    @classmethod
    def _device_can_train(cls, value: str) -> str:
        # torch parses many more (meta, xla, ...), but training fails on them only at the first step
        if not _TRAINING_DEVICE.match(value):
            raise ValueError(f"{value!r} is not a device training can use; use auto, cpu, cuda, cuda:N "
                             "(N: the card's index) or mps")
        return value

    @model_validator(mode="after")
    def _batch_sizes_agree(self) -> "TrainConfig":
        micro = self.batch_size if self.micro_batch_size in (None, "auto") else self.micro_batch_size
        if micro > self.batch_size:
            raise ValueError(f"micro_batch_size ({micro}) is larger than batch_size ({self.batch_size}); "
                             "the micro-batch is the part of the batch that fits, so it must be ≤ batch_size")
        if self.batch_size % micro:
            raise ValueError(f"batch_size ({self.batch_size}) is not a multiple of micro_batch_size ({micro}); "
                             f"try micro_batch_size={micro_batch_at_most(self.batch_size, micro)}")
        if self.max_steps is None and self.epochs is None:
            raise ValueError("set train.max_steps or train.epochs to bound the run")
        return self


class EarlyStoppingConfig(Section):
    enabled: bool = Field(False, description="Stop when the monitored metric stops improving.")
    patience: int = Field(5, gt=0, description="Evaluations without improvement before stopping.")
    min_delta: float = Field(0.0, ge=0, description="Smallest change that counts as an improvement.")
    restore_best: bool = Field(True, description="Put the best weights back at the end of training.")


class EvalConfig(Section):
    every_steps: int | None = Field(None, gt=0, description="Evaluate on validation every N optimizer steps.")
    every_epoch: bool = Field(True, description="Evaluate at the end of every epoch.")
    monitor: str = Field("val/loss", description="Metric that decides `best` and early stopping, "
                         "as `val/<metric>` (loss, accuracy, balanced_accuracy, mae, ...).")
    mode: Literal["min", "max", "auto"] = Field("auto", description="Whether lower or higher is better; "
                                                "`auto`: min for loss/error metrics, max otherwise.")
    early_stopping: EarlyStoppingConfig = Field(default_factory=EarlyStoppingConfig,
                                                description="Stopping when the monitored metric stalls.")

    @property
    def monitor_mode(self) -> Literal["min", "max"]:
        if self.mode != "auto":
            return self.mode
        return metric_mode(self.monitor)


class CheckpointConfig(Section):
    every_steps: int | None = Field(None, gt=0, description="Write a checkpoint every N optimizer steps "
                                    "(it is always written after each evaluation and at the end).")
    keep_last: int = Field(3, ge=1, description="Step checkpoints to keep; `last` and `best` are kept apart.")


class TelemetryConfig(Section):
    enabled: bool = Field(True, description="Record GPU and host telemetry to system.jsonl while training.")
    interval_s: float = Field(2.0, ge=MIN_TELEMETRY_INTERVAL_S, le=MAX_TELEMETRY_INTERVAL_S,
                              description="Seconds between telemetry samples "
                              f"({MIN_TELEMETRY_INTERVAL_S:g} to {MAX_TELEMETRY_INTERVAL_S:g}).")
    temperature_warn_c: float = Field(80.0, description="GPU temperature that raises a warning event.")
    temperature_fail_c: float = Field(90.0, description="GPU temperature that raises an error event.")
    starvation_util_below: float = Field(50.0, ge=0, le=100, description="GPU utilisation (%) under which, "
                                         "with a high data wait, the run is called data-starved.")
    starvation_wait_above: float = Field(0.3, ge=0, le=1, description="Share of step time spent waiting "
                                         "for data above which the loader is suspected.")

    @model_validator(mode="after")
    def _warning_before_failure(self) -> "TelemetryConfig":
        if self.temperature_warn_c >= self.temperature_fail_c:
            raise ValueError(f"the warning temperature ({self.temperature_warn_c:g} °C) must be below the failure "
                             f"temperature ({self.temperature_fail_c:g} °C)")
        return self


class RunConfig(Section):
    """One training run, every default filled in. Written to RUN/config.yaml before step 1."""

    # 0..2**32-1 is what every seeded library takes as is (NumPy's legacy seeding, scikit-learn's
    # random_state, and likely the user's own data factory, which gets `seed=`); a wider seed would have to
    # be folded into that range, and two seeds giving one run is worse than a clear refusal.
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seeds python, numpy and torch, the data split and "
                      f"the data order: an integer from 0 to {MAX_SEED}.")
    name: str | None = Field(None, description="A label for reports and comparisons.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The model and how it is built.")
    data: DataConfig = Field(default_factory=DataConfig, description="The data, its splits and its loader.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="The optimizer.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="The learning-rate schedule.")
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(max_steps=100),
                               description="How long, on what, in which precision and layout the engine trains.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Validation during training.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="When checkpoints are "
                                         "written and how many are kept.")
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig, description="GPU and host sampling "
                                       "during training, and its alert thresholds.")

    @model_validator(mode="after")
    def _warmup_fits(self) -> "RunConfig":
        steps = self.train.max_steps
        if steps is not None and self.schedule.warmup_fraction is None and self.schedule.warmup_steps >= steps:
            raise ValueError(f"schedule.warmup_steps ({self.schedule.warmup_steps}) must be smaller than "
                             f"train.max_steps ({steps}); or set schedule.warmup_fraction")
        return self
