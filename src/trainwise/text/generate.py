"""Sampling text from a language model: temperature, top-k, a token budget, a stop at end-of-text.

The built-in gpt reuses the keys and values of the tokens it has seen (KVCache): each new token costs one
position's forward. A Hugging Face model generates with its own `generate` (its own cache). Temperature 0
is greedy decoding: the same text every time.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from trainwise.errors import ConfigError, TrainwiseWarning
from trainwise.text.gpt import GPT
from trainwise.text.run_checks import model_context
from trainwise.data.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 100
    temperature: float = 0.0  # greedy, as `trainwise eval` generates; higher samples
    top_k: int | None = 50
    seed: int = 0

    def check(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens {self.max_tokens}: generate at least one token.")
        if self.temperature < 0:
            raise ConfigError(f"--temperature {self.temperature}: 0 (greedy) or more.")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k {self.top_k}: at least 1 (or leave it unset for the whole vocabulary).")


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> torch.Tensor:
    """One id per row from the last position's logits [B, V]."""
    if sampling.temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probabilities = torch.softmax(logits, dim=-1)
    return torch.multinomial(probabilities.cpu(), 1, generator=generator).to(logits.device)


@torch.no_grad()
def generate_ids(model: nn.Module, prompt: list[int], sampling: Sampling, *, eos_id: int | None,
                 device: torch.device) -> list[int]:
    """The ids generated after `prompt` (without it), up to max_tokens or the end-of-text id."""
    sampling.check()
    model.eval()
    generator = torch.Generator().manual_seed(sampling.seed)
    if not isinstance(model, GPT):
        return _generate_hugging_face(model, prompt, sampling, eos_id=eos_id, device=device)
    context = model.config.context
    ids = torch.tensor([prompt[-context:]], device=device)
    cache = model.new_cache()
    logits = model(ids, cache=cache)[:, -1]
    out: list[int] = []
    for _ in range(sampling.max_tokens):
        token = next_token(logits, sampling, generator)
        out.append(int(token))
        if eos_id is not None and out[-1] == eos_id:
            break
        if cache.seen >= context:  # the position table is full: start again on the last half-context
            window = (prompt + out)[-(context // 2):]
            cache = model.new_cache()
            logits = model(torch.tensor([window], device=device), cache=cache)[:, -1]
        else:
            logits = model(token.view(1, 1), cache=cache)[:, -1]
    return out


def _generate_hugging_face(model: nn.Module, prompt: list[int], sampling: Sampling, *, eos_id: int | None,
                           device: torch.device) -> list[int]:
    torch.manual_seed(sampling.seed)
    prompt, max_new = _within_context(prompt, sampling.max_tokens, model_context(model))
    ids = torch.tensor([prompt], device=device)
    greedy = sampling.temperature == 0
    options = {"do_sample": not greedy, "max_new_tokens": max_new, "eos_token_id": eos_id,
               "pad_token_id": eos_id, "attention_mask": torch.ones_like(ids), "use_cache": True}
    if not greedy:
        options.update(temperature=sampling.temperature, top_k=sampling.top_k or 0)
    generated = model.generate(ids, **options)
    return generated[0, len(prompt):].tolist()


def _within_context(prompt: list[int], max_tokens: int, context: int | None) -> tuple[list[int], int]:
    """The prompt and token budget that fit the model's position table (a GPT-2-style model has no row past
    it): the prompt's oldest tokens left out, the new tokens capped; each said as a warning."""
    if context is None or len(prompt) + max_tokens <= context:
        return prompt, max_tokens
    keep = max(1, min(len(prompt), context - 1))
    if keep < len(prompt):
        warnings.warn(f"the prompt is {len(prompt):,} tokens and the model's context {context:,} positions: its "
                      f"first {len(prompt) - keep:,} tokens are left out.", TrainwiseWarning, stacklevel=3)
    budget = min(max_tokens, context - keep)
    warnings.warn(f"the model's context is {context:,} positions: generation stops after {budget:,} new tokens "
                  f"(--max-tokens {max_tokens:,} would pass its position table).", TrainwiseWarning, stacklevel=3)
    return prompt[len(prompt) - keep:], budget


def generate_text(model: nn.Module, tokenizer: Tokenizer, prompt: str, sampling: Sampling, *,
                  device: torch.device) -> str:
    """The text the model writes after `prompt`."""
    ids = tokenizer.encode(prompt)
    if not ids:
        if tokenizer.eos_id is None:
            raise ConfigError("--prompt is empty and the tokenizer has no end-of-text id to start from; give a prompt.")
        ids = [tokenizer.eos_id]  # an empty prompt: start as after a document's end
    out = generate_ids(model, ids, sampling, eos_id=tokenizer.eos_id, device=device)
    if out and out[-1] == tokenizer.eos_id:
        out = out[:-1]
    return tokenizer.decode(out)
