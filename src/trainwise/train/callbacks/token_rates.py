"""The engine's language-model pieces: tokens/s and model FLOPs utilisation (MFU), per rank, as torchtitan
reports them; and the run's copy of its tokenizer (RUN/tokenizer), which generation and export read.

MFU = tokens/s × training FLOPs per token / the card's dense peak for the run's precision. FLOPs per token
are 6N + 12·L·H·Q·T (PaLM, appendix B): 6 per weight of the matrix products (forward 2, backward 4) and
the attention scores and values over a context of T. A frozen weight (a LoRA or freeze run's base) costs 4:
its backward still carries the gradient to the layers below (2) but computes none for itself, so counting
it at 6 would overstate an adapter run's MFU by up to half. Below the lowest block that trains (`method:
freeze`'s frozen blocks, unless a trained input embedding pulls the gradient to the bottom) no backward runs
at all: those weights cost 2 and their attention 4·H·Q·T. Recomputation under activation checkpointing is
not counted (that would be hardware FLOPs, not model FLOPs). The peak comes from the GPU catalogue, which the
engine does not import: launch/ hands a lookup over with `PeakFlops` (a CPU has no catalogue peak, and
the progress line says so instead of printing a number).
"""
from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from trainwise.errors import TrainwiseWarning
from trainwise.text.run_checks import check_language_run, short_run_warning
from trainwise.data.text.tokenizer import record_sequence_length
from trainwise.train.callbacks.base import Callback
from trainwise.data.batch import MicroBatch, is_token_batch, real_tokens

PeakLookup = Callable[[str, str, bool], "float | None"]  # (device name, precision, tf32) -> FLOP/s or None


def tokens_in(micro_batches: Sequence[MicroBatch]) -> tuple[int, int]:
    """(real tokens, sequence length) of a step's token batches: padding is not counted, so tokens/s and MFU
    are the work that trains (counted on the host batches: no device work); (0, 0) for `(inputs, targets)`."""
    if not micro_batches or not is_token_batch(micro_batches[0]):
        return 0, 0
    return real_tokens(micro_batches), int(micro_batches[0]["input_ids"].shape[-1])  # type: ignore[index]


def matmul_parameters(model: nn.Module) -> tuple[int, int, int]:
    """(trained, frozen with a backward, frozen forward-only) weights that take part in matrix products: every
    parameter but lookup tables (an embedding's rows are gathered, not multiplied), counting a table tied to the
    output head once, as the head. Forward-only: frozen, in a block below every block that trains."""
    block_of = _block_index(model)
    lowest = lowest_trained_block(model, block_of)
    seen: set[int] = set()
    trained = frozen = forward_only = 0
    for module in model.modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            continue
        for parameter in module.parameters(recurse=False):
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if parameter.requires_grad:
                trained += parameter.numel()
            elif block_of.get(id(parameter), lowest) < lowest:
                forward_only += parameter.numel()
            else:
                frozen += parameter.numel()
    return trained, frozen, forward_only


def _block_index(model: nn.Module) -> dict[int, int]:
    """Each parameter of the model's transformer blocks (llm/methods.py transformer_blocks) -> its block's
    index; empty for a model without a stack of blocks."""
    from trainwise.errors import ConfigError
    from trainwise.llm.methods import transformer_blocks

    try:
        blocks = transformer_blocks(model)
    except ConfigError:
        return {}
    return {id(p): index for index, block in enumerate(blocks) for p in block.parameters()}


def lowest_trained_block(model: nn.Module, block_of: dict[int, int] | None = None) -> int:
    """The index of the lowest block that trains, which the gradient must reach: 0 when anything before the
    blocks trains (a trained input embedding needs the gradient at the bottom), the block count when only what
    follows them trains (the head), 0 for a model without a stack of blocks (every frozen weight backward).
    `block_of`: _block_index(model), when the caller has it."""
    block_of = _block_index(model) if block_of is None else block_of
    if not block_of:
        return 0
    blocks = max(block_of.values()) + 1
    lowest, in_blocks_yet = blocks, False
    for parameter in model.parameters():  # registration order: embeddings, blocks bottom up, norm, head
        index = block_of.get(id(parameter))
        in_blocks_yet = in_blocks_yet or index is not None
        if parameter.requires_grad:
            lowest = min(lowest, index if index is not None else (blocks if in_blocks_yet else 0))
    return lowest


def attention_shape(config: object) -> tuple[int, int, int] | None:
    """(layers, heads, head dim) from a Hugging Face config or the built-in GPT's; None when it has none."""
    def first(*names: str):
        return next((value for name in names if (value := getattr(config, name, None))), None)

    layers = first("num_hidden_layers", "n_layer", "layers")
    heads = first("num_attention_heads", "n_head", "heads")
    width = first("hidden_size", "n_embd", "width")
    if not (layers and heads and width):
        return None
    return layers, heads, first("head_dim") or width // heads


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """6 per trained and 4 per frozen matrix weight, 2 per frozen weight below every block that trains; plus
    attention where the model has a transformer config (Hugging Face, the built-in gpt): 12·H·Q·T a layer, 4·H·Q·T
    (forward only) a layer below every block that trains. Weights only otherwise."""
    trained, frozen, forward_only = matmul_parameters(model)
    shape = attention_shape(getattr(model, "config", None))
    attention = 0.0
    if shape:
        layers, heads, head_dim = shape
        below = min(lowest_trained_block(model), layers)
        attention = (12.0 * (layers - below) + 4.0 * below) * heads * head_dim * seq_len
    return 6.0 * trained + 4.0 * frozen + 2.0 * forward_only + attention


def token_figures(tokens_per_s: float, flops: float, peak_flops: float | None) -> dict[str, float]:
    figures = {"tokens_per_s": tokens_per_s, "flops_per_token": flops}
    if peak_flops:
        figures["mfu"] = tokens_per_s * flops / peak_flops
    return figures


class TokenFigures:
    """What a log interval's tokens/s means for this model: FLOPs per token at the batches' sequence length,
    and MFU against `peak_flops` (the card's, set by PeakFlops; None on a CPU)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.peak_flops: float | None = None
        self._flops: dict[int, float] = {}

    def __call__(self, tokens_per_s: float, seq_len: int) -> dict[str, float]:
        if seq_len not in self._flops:
            self._flops[seq_len] = flops_per_token(self.model, seq_len)
        return token_figures(tokens_per_s, self._flops[seq_len], self.peak_flops)


def record_attention(config, model: nn.Module) -> str | None:
    """The attention implementation a Hugging Face model runs, written into the run's config (model.attention,
    so config.yaml says it and a resume builds the same); None for other models."""
    from trainwise.llm.hf import CUDA_ATTENTION, attention_of

    attention = attention_of(model)
    if attention in CUDA_ATTENTION:
        config.model.attention = attention
    return attention


class PeakFlops(Callback):
    """Gives the run's token figures its card's dense peak (FLOP/s) for the run's precision, looked up by
    launch/ in the planner's catalogue."""

    def __init__(self, lookup: PeakLookup):
        self.lookup = lookup

    def on_fit_start(self, trainer) -> None:
        if trainer.device.type != "cuda":
            return
        import torch

        name = torch.cuda.get_device_name(trainer.device)
        trainer.token_figures.peak_flops = self.lookup(name, str(trainer.precision), bool(trainer.tf32))


class KeepTokenizer(Callback):
    """A text run keeps the tokenizer its data was made with, and its sequence length, in RUN/tokenizer
    (copied whole, then renamed into place): `trainwise generate` and `export` need nothing else."""

    def __init__(self, source: str | Path, seq_len: int):
        self.source, self.seq_len = Path(source), seq_len

    def on_fit_start(self, trainer) -> None:
        target = trainer.run_dir.tokenizer_dir()
        if not trainer.ranks.is_main or target.is_dir():
            return
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(self.source, partial)
        record_sequence_length(partial, self.seq_len)
        partial.rename(target)


def check_text_run(bundle, model: nn.Module, kept_tokenizer: Path | None, starting=None) -> None:
    """Before step 1 and before anything is written: text/run_checks.py refuses a run whose data, model and
    kept tokenizer (`kept_tokenizer`: RUN/tokenizer of a run being resumed) disagree; its warnings are said.
    `starting`: the RunConfig of a run that starts (not resumes): an epoch-driven one (sft-lora) too short to
    learn is said with its numbers."""
    said = check_language_run(bundle, model, kept_tokenizer if kept_tokenizer and kept_tokenizer.is_dir() else None)
    if starting is not None and starting.train.max_steps is None:
        said = [*said, short_run_warning(len(bundle.train), starting.train.batch_size, starting.train.epochs,
                                         int(bundle.spec.input_shape[0]))]
    for warning in said:
        if warning:
            warnings.warn(warning, TrainwiseWarning, stacklevel=2)
