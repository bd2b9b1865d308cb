"""Judging a fine-tune on held-out conversations: does it give the answer, and how did it change the base?

- `exact_match`: the model answers each held-out prompt (greedy, rendered with the run's chat template exactly
  as in training) and its answer is compared with the reference, whitespace at the ends ignored. For tasks with
  one right answer (copy, reverse, arithmetic, a label) this is the figure users care about; token accuracy and
  loss on the answers (the -100-masked validation metrics of the text path) say how close it came.
- `side_by_side`: the base model's and the tuned model's answers to the same fixed prompts, for the report. A
  LoRA model's base is itself with the adapter switched off (peft's `disable_adapter`), so nothing is rebuilt.

Greedy decoding here is plain (the whole sequence each step): answers of a few dozen tokens on held-out sets of
a few hundred prompts, where a KV cache would not change the verdict.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

Messages = Sequence[dict[str, str]]
MAX_EXAMPLES = 20  # answers kept in the result (the first ones, right or wrong)


@dataclass(frozen=True)
class Answer:
    prompt: str
    reference: str
    answer: str

    @property
    def correct(self) -> bool:
        return self.answer.strip() == self.reference.strip()


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    out = model(input_ids=ids, position_ids=positions)
    return (out.logits if hasattr(out, "logits") else out)[0, -1]


@torch.no_grad()
def greedy_answer(model: nn.Module, tokenizer: Any, template: Any, messages: Messages, *,
                  max_new_tokens: int = 64, device: torch.device | str = "cpu") -> str:
    """The model's answer to the last user turn of `messages`: greedy tokens until end-of-text, the template's
    end-of-answer text, or `max_new_tokens`; the end marker is not part of the answer."""
    ids = torch.tensor([tokenizer.encode(template.prompt(messages))], device=device)
    stop = template.stop_text
    produced: list[int] = []
    for _ in range(max_new_tokens):
        token = int(_logits(model, ids).argmax())
        if token == tokenizer.eos_id:
            break
        produced.append(token)
        ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
        if stop and stop in tokenizer.decode(produced[-8:]):
            break
    text = tokenizer.decode(produced)
    return (text.split(stop)[0] if stop else text).rstrip()  # the template's closing newlines are not the answer


def split_prompt(conversation: Any) -> tuple[list[dict[str, str]], str]:
    """(the messages before the last answer, the last answer): what a held-out conversation asks and expects."""
    messages = conversation.as_messages() if hasattr(conversation, "as_messages") else list(conversation)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:last], messages[last]["content"]


def exact_match(model: nn.Module, tokenizer: Any, template: Any, conversations: Sequence[Any], *,
                max_new_tokens: int = 64, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Share of held-out conversations whose last answer the model reproduces exactly."""
    model.eval()
    answers = []
    for conversation in conversations:
        prompt, reference = split_prompt(conversation)
        answers.append(Answer(prompt[-1]["content"], reference, greedy_answer(
            model, tokenizer, template, prompt, max_new_tokens=max_new_tokens, device=device)))
    right = sum(a.correct for a in answers)
    return {"exact_match": right / len(answers) if answers else float("nan"), "answers": len(answers),
            "correct": right, "examples": [a.__dict__ | {"correct": a.correct} for a in answers[:MAX_EXAMPLES]]}


@contextlib.contextmanager
def adapter_off(model: nn.Module):
    """The base model: `model` with its peft adapter switched off (it must hold one)."""
    from trainwise.llm.optional import require

    peft = require("peft", "comparing a LoRA model with its base")
    inner = next((m for m in model.modules() if isinstance(m, peft.PeftModel)), None)
    if inner is None:
        raise ValueError("the model holds no peft adapter; give the base model itself")
    with inner.disable_adapter():
        yield model


def side_by_side(tuned: nn.Module, tokenizer: Any, template: Any, prompts: Sequence[Any], *,
                 base: nn.Module | None = None, max_new_tokens: int = 64,
                 device: torch.device | str = "cpu") -> list[dict[str, str]]:
    """For each prompt (a user text, or a held-out conversation), the base's and the tuned model's answers
    (and the reference when the prompt has one). `base`: None for a LoRA model (its adapter switched off)."""
    rows = []
    tuned.eval()
    for item in prompts:
        messages, reference = ([{"role": "user", "content": item}], None) if isinstance(item, str) \
            else split_prompt(item)
        answer = greedy_answer(tuned, tokenizer, template, messages, max_new_tokens=max_new_tokens, device=device)
        if base is None:
            with adapter_off(tuned):
                before = greedy_answer(tuned, tokenizer, template, messages, max_new_tokens=max_new_tokens,
                                       device=device)
        else:
            before = greedy_answer(base.eval(), tokenizer, template, messages, max_new_tokens=max_new_tokens,
                                   device=device)
        rows.append({"prompt": messages[-1]["content"], "base": before, "tuned": answer,
                     **({"reference": reference} if reference is not None else {})})
    return rows
