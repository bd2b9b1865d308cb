"""Instruction samples as tokens: ids, which of them carry loss, and the labels the engine reads.

A conversation goes through a chat template into segments (chat_templates.py); each segment is encoded on its
own, so a prompt at generation time is encoded exactly as it was in training. A token carries loss only when it
belongs to an assistant answer (not one of weight 0, which is context). Labels follow the batch contract:
`labels[t]` is the id expected at output t (`ids[t + 1]`), or -100 where that next token is prompt, system text,
markup, or a weight-0 answer.

Over-long samples (more than `max_tokens`): `truncate` drops tokens from the start (the oldest prompt text)
as long as the last answer stays whole, else the sample is dropped; `drop` drops every over-long sample.
Both are counted, never silent.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Literal

from trainwise.data.batch import IGNORE_INDEX
from trainwise.errors import DataError
from trainwise.data.text.chat import Conversation
from trainwise.data.text.chat_templates import ChatTemplate, Segment

TooLong = Literal["truncate", "drop"]


@dataclass(frozen=True)
class Sample:
    ids: list[int]
    trains: list[bool]  # per token: True for tokens of an assistant answer

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class EncodeStats:
    samples: int = 0
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_no_answer: int = 0
    blank_answers_as_context: int = 0  # blank answers of chats whose other answers train: no loss on them
    tokens: int = 0
    loss_tokens: int = 0
    lengths: list[int] = field(default_factory=list)  # before truncation: what the data asks for (histogram)
    problems: list[str] = field(default_factory=list)  # "source: why" for conversations the template refused

    @property
    def loss_share(self) -> float:
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "truncated": self.truncated, "dropped_too_long": self.dropped_too_long,
                "dropped_no_answer": self.dropped_no_answer,
                "blank_answers_as_context": self.blank_answers_as_context, "tokens": self.tokens,
                "loss_tokens": self.loss_tokens, "loss_share": round(self.loss_share, 4)}


def encode_conversation(conversation: Conversation | list[dict[str, str]], template: ChatTemplate,
                        tokenizer: Any, *, mask_prompt: bool = True) -> Sample:
    """Token ids and per-token loss flags. `mask_prompt=False` (an ablation) lets every token carry loss."""
    messages = conversation.as_messages() if isinstance(conversation, Conversation) else conversation
    segments = _weighted(template.segments(messages), conversation, template)
    ids: list[int] = []
    trains: list[bool] = []
    piece: list[int] = []
    for segment in segments:
        piece = list(tokenizer.encode(segment.text)) if segment.text else []
        if segment.end_of_answer:
            if tokenizer.eos_id is None:
                raise DataError(f"the {template.name} template ends each answer with the tokenizer's end-of-text "
                                "token, and this tokenizer has none; use --template chatml.")
            piece.append(tokenizer.eos_id)
        ids += piece
        trains += [segment.trains or not mask_prompt] * len(piece)
    if tokenizer.eos_id is not None and ids and tokenizer.eos_id not in piece:
        # every sample ends with the eos, learnt when an answer ends it; once: where the eos is the template's
        # end-of-turn (<|im_end|>, Qwen/SmolLM) the last segment already closed with it
        ids.append(tokenizer.eos_id)
        trains.append(trains[-1])
    return Sample(ids, trains)


def _weighted(segments: list[Segment], conversation: Conversation | list[dict[str, str]],
              template: ChatTemplate) -> list[Segment]:
    """The segments with answers of weight 0 (context only) not carrying loss. Every template writes one
    training segment per assistant message, in order, so the i-th training segment is the i-th answer."""
    if not isinstance(conversation, Conversation) or all(t.trains for t in conversation.turns
                                                          if t.role == "assistant"):
        return segments
    answers = [t.trains for t in conversation.turns if t.role == "assistant"]
    if sum(s.trains for s in segments) != len(answers):
        raise DataError(f"{conversation.source}: the {template.name} chat template wrote "
                        f"{sum(s.trains for s in segments)} answers for {len(answers)} assistant turns, so the "
                        "turns with weight 0 cannot be found; use --template chatml.")
    weights = iter(answers)
    return [replace(s, trains=next(weights)) if s.trains else s for s in segments]


def fit_length(sample: Sample, max_tokens: int, too_long: TooLong) -> tuple[Sample | None, str]:
    """(the sample as it is kept or None, what happened: 'kept' | 'truncated' | 'dropped')."""
    if len(sample) <= max_tokens:
        return sample, "kept"
    if too_long == "drop":
        return None, "dropped"
    start = len(sample) - max_tokens
    trains = sample.trains
    answer_starts = [i for i in range(1, len(trains)) if trains[i] and not trains[i - 1]]
    # the last answer survives whole, with the token before it (its output predicts the answer's first token)
    if answer_starts and start > answer_starts[-1] - 1:
        return None, "dropped"
    return Sample(sample.ids[start:], trains[start:]), "truncated"


def labels_for(sample: Sample) -> list[int]:
    """Labels aligned with the model's outputs: output t predicts ids[t + 1] where that token trains."""
    ids, trains = sample.ids, sample.trains
    return [ids[t + 1] if trains[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)] + [IGNORE_INDEX]


def _answers_empty(conversation: Conversation | list[dict[str, str]]) -> bool:
    """Whether every answer that carries loss is blank (an empty `output`, `completion` or assistant message)."""
    if not isinstance(conversation, Conversation):
        return False
    answers = [t.content for t in conversation.turns if t.trains]
    return bool(answers) and not any(answer.strip() for answer in answers)


def _blank_answers_as_context(conversation: Conversation | list[dict[str, str]]):
    """(the conversation with its blank answers given weight 0, how many): in a chat whose other answers train,
    a blank one would teach the model to stop at once after its prompt; as context it teaches nothing."""
    if not isinstance(conversation, Conversation):
        return conversation, 0
    blank = sum(t.trains and not t.content.strip() for t in conversation.turns)
    if not blank:
        return conversation, 0
    turns = tuple(replace(t, weight=0) if t.trains and not t.content.strip() else t for t in conversation.turns)
    return replace(conversation, turns=turns), blank


def encode_all(conversations: Iterable[Conversation], template: ChatTemplate, tokenizer: Any, *,
               max_tokens: int, too_long: TooLong = "truncate",
               mask_prompt: bool = True) -> tuple[list[Sample], EncodeStats]:
    samples, stats = [], EncodeStats()
    for conversation in conversations:
        if _answers_empty(conversation):  # it would train only the end-of-answer marker: stop at once
            stats.dropped_no_answer += 1
            stats.problems.append(f"{conversation.source or 'a conversation'}: every answer is empty (blank), "
                                  "nothing to learn; dropped")
            continue
        conversation, blank = _blank_answers_as_context(conversation)
        stats.blank_answers_as_context += blank
        try:
            sample = encode_conversation(conversation, template, tokenizer, mask_prompt=mask_prompt)
        except DataError as e:  # this row only (a template that refuses a system turn, say): named, skipped
            stats.problems.append(f"{getattr(conversation, 'source', '') or 'a conversation'}: {e}")
            continue
        stats.lengths.append(len(sample))
        kept, what = fit_length(sample, max_tokens, too_long)
        if kept is None:
            stats.dropped_too_long += 1
            continue
        if not any(kept.trains[1:]):  # an empty answer: no output position has a target
            stats.dropped_no_answer += 1
            continue
        stats.truncated += what == "truncated"
        stats.samples += 1
        stats.tokens += len(kept)
        stats.loss_tokens += sum(kept.trains[1:])
        samples.append(kept)
    if not samples and stats.problems and not stats.lengths and not stats.dropped_no_answer:
        raise DataError(f"the chat template rendered no conversation; the first: {stats.problems[0]}")
    if not samples:
        raise DataError(f"no sample is left: {stats.dropped_too_long} longer than {max_tokens} tokens "
                        f"(too_long={too_long}), {stats.dropped_no_answer} with an empty answer. Raise "
                        "data.seq_len (--seq-len) or use --too-long truncate.")
    return samples, stats
