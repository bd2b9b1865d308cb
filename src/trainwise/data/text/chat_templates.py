"""Chat templates: a conversation as text segments, each saying whether it carries loss.

Two kinds, one interface (`segments`, `prompt`, `stop_text`):
- the tokenizer's own Jinja template (a model directory's `chat_template`), rendered by transformers. The
  assistant's text is found by rendering the conversation up to each answer twice, with and without the answer:
  the difference is the answer as the template writes it (end-of-turn marker included, so the model learns to stop);
- a few built-ins for tokenizers without one: `chatml`, `llama3`, `plain` (alpaca-style "### Instruction:").

Training and generation share the segmentation: a prompt is encoded exactly as the prompt part of a training
sample was, so the model sees at `trainwise generate` what it learned on.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from trainwise.errors import DataError

Messages = Sequence[dict[str, str]]


@dataclass(frozen=True)
class Segment:
    text: str
    trains: bool  # True: the assistant's answer (loss); False: prompt, system, template markup (-100)
    end_of_answer: bool = False  # the template ends an answer with the tokenizer's EOS id, appended after encoding


class ChatTemplate(Protocol):
    name: str

    def segments(self, messages: Messages) -> list[Segment]: ...

    def prompt(self, messages: Messages) -> str: ...

    @property
    def stop_text(self) -> str | None: ...


@dataclass(frozen=True)
class BuiltinTemplate:
    """A template written as format strings: a turn is `turn.format(role=, content=)`; the answer is
    `answer_open` + content + `answer_close` (with the tokenizer's EOS after it when `close_with_eos`)."""

    name: str
    turn: str
    answer_open: str
    answer_close: str
    begin: str = ""
    system_turn: str | None = None
    user_turn: str | None = None
    close_with_eos: bool = False
    jinja: str = ""  # the same template in Hugging Face's Jinja form, written into exported tokenizers
    markers: tuple[str, ...] = ()  # its markup, one special id each in a BPE trained for it

    def _render_prompt_turn(self, message: dict[str, str]) -> str:
        pattern = {"system": self.system_turn, "user": self.user_turn}.get(message["role"]) or self.turn
        return pattern.format(role=message["role"], content=message["content"])

    def segments(self, messages: Messages) -> list[Segment]:
        out, pending = [], self.begin
        for message in messages:
            if message["role"] == "assistant":
                out.append(Segment(pending + self.answer_open, trains=False))
                out.append(Segment(message["content"] + self.answer_close, trains=True,
                                   end_of_answer=self.close_with_eos))
                pending = ""
            else:
                pending += self._render_prompt_turn(message)
        if pending:
            out.append(Segment(pending, trains=False))
        return out

    def prompt(self, messages: Messages) -> str:
        """The text the model continues to answer the last user turn (what generation encodes)."""
        return "".join(s.text for s in self.segments(messages)) + self.answer_open

    @property
    def stop_text(self) -> str | None:
        return self.answer_close.strip() or None


BUILTIN_TEMPLATES = {
    "chatml": BuiltinTemplate(
        name="chatml", turn="<|im_start|>{role}\n{content}<|im_end|>\n",
        answer_open="<|im_start|>assistant\n", answer_close="<|im_end|>\n", markers=("<|im_start|>", "<|im_end|>"),
        jinja="{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    "llama3": BuiltinTemplate(
        name="llama3", begin="<|begin_of_text|>",
        turn="<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
        answer_open="<|start_header_id|>assistant<|end_header_id|>\n\n", answer_close="<|eot_id|>",
        markers=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        jinja="<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
              "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
              "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    "plain": BuiltinTemplate(
        name="plain", turn="{content}\n\n", user_turn="### Instruction:\n{content}\n\n",
        answer_open="### Response:\n", answer_close="\n\n", close_with_eos=True,
        jinja="{% for m in messages %}{% if m['role'] == 'user' %}### Instruction:\n{{ m['content'] }}\n\n"
              "{% elif m['role'] == 'assistant' %}### Response:\n{{ m['content'] }}\n\n{{ eos_token }}"
              "{% else %}{{ m['content'] }}\n\n{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}### Response:\n{% endif %}"),
}


class JinjaTemplate:
    """The tokenizer's own chat template (Hugging Face Jinja), rendered with transformers."""

    name = "tokenizer"

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        self.special_tokens = dict(special_tokens or {})

    def _render(self, messages: Messages, add_generation_prompt: bool) -> str:
        return render_jinja(self.source, list(messages), add_generation_prompt, self.special_tokens)

    def segments(self, messages: Messages) -> list[Segment]:
        """The conversation as the template writes it (`full`), cut where each answer starts and ends.

        Where the template renders a conversation as an extension of its earlier turns (most do), an answer
        starts where the prompt up to it (with the generation prompt) stops, and ends where the render up to
        and including it stops: the end-of-turn marker is the answer's, so the model learns to stop. Some
        templates write text only after the last turn (Phi-3 closes the conversation with end-of-text, OLMo
        closes the last answer differently): that closing text belongs to the last answer only. Templates that
        rewrite earlier text (a system prompt moved into the last user turn, as Mistral's do) are cut by finding
        each turn's own text in order."""
        full = self._render(messages, add_generation_prompt=False)
        out, done, searched = [], 0, 0
        for i, message in enumerate(messages):
            if message["role"] == "system":
                continue  # a template may move it (into the last user turn): not a landmark
            if message["role"] != "assistant":
                searched = max(searched, _find(full, message["content"], max(done, searched))[1])
                continue
            span = self._prefix_span(full, messages, i, done)
            if span is None:
                start, end = _find(full, message["content"], max(done, searched))
                span = None if start < 0 else (start, end + self._closing_marker_at(full, end))
            if span is None:
                raise DataError(
                    f"the tokenizer's chat template writes turn {i + 1} in a way trainwise cannot find in the "
                    "rendered conversation (it rewrites the answer's text), so the answer's tokens cannot be told "
                    "apart. Use --template chatml (or llama3, plain) instead.")
            start, end = span
            out.append(Segment(full[done:start], trains=False))
            out.append(Segment(full[start:end], trains=True))
            done = searched = end
        if full[done:]:
            out.append(Segment(full[done:], trains=False))
        return [segment for segment in out if segment.text or segment.trains]

    def _prefix_span(self, full: str, messages: Messages, i: int, done: int) -> tuple[int, int] | None:
        """(start, end) of answer i where the template extends its earlier turns; None where it does not."""
        before = self._render(messages[:i], add_generation_prompt=True)
        if len(before) < done or not full.startswith(before):
            return None
        after = self._render(messages[: i + 1], add_generation_prompt=False)
        eos = self.special_tokens.get("eos_token") or ""
        for answer_end in (after, after.removesuffix(eos) if eos else after):
            if len(answer_end) > len(before) and full.startswith(answer_end):
                return len(before), len(answer_end)
        return None

    def _closing_marker_at(self, full: str, end: int) -> int:
        """How many characters of the template's end-of-answer text follow an answer found by its text."""
        eos = self.special_tokens.get("eos_token") or ""
        marker = self._text_after_answer
        for candidate in (marker, marker.removesuffix(eos) if eos else "", marker.strip()):
            if candidate and full.startswith(candidate, end):
                return len(candidate)
        return 0

    @functools.cached_property
    def _text_after_answer(self) -> str:
        """What the template writes after an answer, from a one-turn render of a sentinel answer (rendered once)."""
        sentinel = "\x00answer\x00"
        rendered = self._render([{"role": "user", "content": "?"}, {"role": "assistant", "content": sentinel}],
                                add_generation_prompt=False)
        return rendered.split(sentinel, 1)[1] if sentinel in rendered else ""

    def prompt(self, messages: Messages) -> str:
        return self._render(messages, add_generation_prompt=True)

    @property
    def stop_text(self) -> str | None:
        """What the template writes right after an answer (`<|im_end|>`, `<|eot_id|>`): found by rendering a
        sentinel answer; the tokenizer's end-of-text when the template writes nothing there."""
        eos = self.special_tokens.get("eos_token") or ""
        text = self._text_after_answer.strip()
        if eos and text.endswith(eos):  # Phi-3 closes the conversation too: "<|end|>\n<|endoftext|>"
            text = text.removesuffix(eos).strip()
        return text or eos or None


def _find(full: str, text: str, since: int) -> tuple[int, int]:
    """(start, end) of `text` in `full` at or after `since` (its stripped form where a template trims it);
    (-1, since) when it is not there."""
    for needle in (text, text.strip()):
        at = full.find(needle, since) if needle else -1
        if at >= 0:
            return at, at + len(needle)
    return -1, since


CHOICE_FILE = "trainwise_chat_template.json"  # beside a saved tokenizer: the template its data was rendered with


def template_record(template: ChatTemplate) -> dict[str, Any]:
    """What a manifest and a run keep, so prompts are rendered later exactly as the training data was."""
    if isinstance(template, JinjaTemplate):
        return {"name": "tokenizer", "special_tokens": template.special_tokens}
    return {"name": template.name}


def save_template_choice(directory: Path, template: ChatTemplate) -> None:
    from trainwise.rundir.atomic import atomic_write_json

    atomic_write_json(Path(directory) / CHOICE_FILE, template_record(template))


def saved_template(directory: Path, tokenizer: Any) -> ChatTemplate | None:
    """The chat template recorded beside a tokenizer (an instruction dataset's, or a run's copy); None when
    the tokenizer's data was plain text."""
    path = Path(directory) / CHOICE_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if record.get("name") in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[record["name"]]
    return choose_template(None, tokenizer)


def template_names() -> list[str]:
    return sorted(BUILTIN_TEMPLATES)


def choose_template(name: str | None, tokenizer: Any) -> ChatTemplate:
    """`--template NAME` (a built-in), or the tokenizer's own template; neither is an error saying the fix."""
    if name:
        if name in ("tokenizer", "auto"):
            name = None
        elif name not in BUILTIN_TEMPLATES:
            raise DataError(f"no built-in chat template {name!r}; choose one of {', '.join(template_names())} "
                            "(or leave --template out to use the tokenizer's own).")
        else:
            return BUILTIN_TEMPLATES[name]
    source = getattr(tokenizer, "chat_template", None)
    if not source:
        raise DataError(
            "the tokenizer has no chat template, so trainwise cannot know how this model expects a conversation "
            f"to be written. Add --template NAME with one of {', '.join(template_names())} (chatml suits a model "
            "you train from scratch), or use a model directory whose tokenizer_config.json has a chat_template.")
    check_template_source(source)
    return JinjaTemplate(source, special_token_strings(tokenizer))


def special_token_strings(tokenizer: Any) -> dict[str, str]:
    """bos/eos strings for a Jinja template's `{{ bos_token }}`, from whatever the tokenizer exposes."""
    out = {}
    backend = getattr(tokenizer, "backend", None)  # a model directory's transformers tokenizer
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tokenizer, key, None) or getattr(backend, key, None)
        if isinstance(value, str):
            out[key] = value
    return out


def render_jinja(source: str, messages: list[dict[str, str]], add_generation_prompt: bool,
                 special_tokens: dict[str, str]) -> str:
    """One conversation through a Hugging Face Jinja chat template (transformers' sandboxed renderer)."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        raise DataError("rendering the tokenizer's chat template needs transformers: "
                        "pip install 'trainwise[llm]' (or use --template chatml, which needs nothing).") from None
    try:
        rendered, _ = render_jinja_template([messages], chat_template=source,
                                            add_generation_prompt=add_generation_prompt, **special_tokens)
    except Exception as e:  # a template's own raise_exception() (e.g. "roles must alternate") or a syntax error
        if _is_syntax_error(e):
            raise _broken_template(e) from None
        raise DataError(f"the tokenizer's chat template failed on this conversation: {e}. "
                        "Fix the data, or use --template chatml.") from None
    return rendered[0]


def check_template_source(source: str) -> None:
    """Refuse a chat template that is not valid Jinja once, up front (not as a failure of every row)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return  # rendering says how to install it
    try:
        _compile_jinja_template(source)
    except Exception as e:
        if _is_syntax_error(e):
            raise _broken_template(e) from None
        raise


def _is_syntax_error(error: Exception) -> bool:
    return type(error).__name__ == "TemplateSyntaxError"  # jinja2's, which transformers imports lazily


def _broken_template(error: Exception) -> DataError:
    line = getattr(error, "lineno", None)
    return DataError(f"the tokenizer's chat template is not valid Jinja ({error.__class__.__name__}"
                     f"{f' at line {line}' if line else ''}: {getattr(error, 'message', None) or error}): the "
                     "template is broken, not the data. Fix chat_template in the tokenizer's tokenizer_config.json "
                     "(or chat_template.jinja), or use --template chatml (or llama3, plain).")
