"""Chat templates as real models ship them, which do not all render a conversation as a plain extension of its
earlier turns: every answer must still train whole (with its end-of-turn marker) and nothing else may."""
from __future__ import annotations

import pytest

from trainwise.errors import DataError
from trainwise.data.text.chat_templates import JinjaTemplate

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "copy: one two"}, {"role": "assistant", "content": "one two"},
        {"role": "user", "content": "reverse: one two"}, {"role": "assistant", "content": "two one"}]

# microsoft/Phi-3-mini-4k-instruct: the whole conversation closes with end-of-text (not each answer)
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
        "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"
        "{% endif %}")
# Mistral-7B-Instruct-v0.3: the system prompt goes into the last user turn (so it moves as turns are added)
MISTRAL = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate user/assistant') }}"
    "{%- endif %}{%- if message['role'] == 'user' %}{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}{%- else %}"
    "{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content'] + eos_token }}{%- endif %}{%- endfor %}")
# open-instruct's OLMo-style ChatML: the last answer closes with end-of-text instead of <|im_end|>. The earlier
# answers train without the marker (trainwise cannot tell it from the next turn's header); the last learns to stop
OLMO = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if m['role'] != 'assistant' or not loop.last %}<|im_end|>\n{% else %}{{ eos_token }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Llama-3-style: contents trimmed, a header per turn
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def trained(template: JinjaTemplate, messages) -> list[str]:
    segments = template.segments(messages)
    full = template._render(messages, add_generation_prompt=False)
    assert "".join(s.text for s in segments) == full  # the segments are the conversation as the template writes it
    return [s.text for s in segments if s.trains]


@pytest.mark.parametrize("source,answers", [
    (PHI3, ["one two<|end|>\n", "two one<|end|>\n</s>"]),
    (MISTRAL, ["one two</s>", "two one</s>"]),
    (OLMO, ["one two", "two one</s>"]),
    (LLAMA3, ["one two<|eot_id|>", "two one<|eot_id|>"]),
])
def test_each_answer_trains_with_its_end_marker_and_nothing_else(source, answers):
    assert trained(JinjaTemplate(source, SPECIAL), CHAT) == answers


def test_an_answer_found_by_its_text_is_never_taken_from_the_prompt_that_quotes_it():
    """`copy: one two` holds the answer's text: a template that moves text around is cut after the user turn."""
    messages = CHAT[1:3]
    moved = [{"role": "system", "content": "one two"}] + messages  # the system text equals the answer, too
    assert trained(JinjaTemplate(MISTRAL, SPECIAL), moved) == ["one two</s>"]
    segments = JinjaTemplate(MISTRAL, SPECIAL).segments(moved)
    assert "copy: one two" in segments[0].text and not segments[0].trains


def test_the_generation_prompt_is_what_the_answer_follows_in_training():
    template = JinjaTemplate(PHI3, SPECIAL)
    segments = template.segments(CHAT)
    assert "".join(s.text for s in segments[:3]) == template.prompt(CHAT[:4])


def test_a_template_that_rewrites_the_answer_names_the_fix():
    shouting = "{% for m in messages | reverse %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
    with pytest.raises(DataError, match="--template chatml"):
        JinjaTemplate(shouting, SPECIAL).segments(CHAT)


def test_a_template_that_refuses_the_conversation_says_so():
    with pytest.raises(DataError, match="roles must alternate"):
        JinjaTemplate(MISTRAL, SPECIAL).segments(CHAT[1:2] + CHAT[1:3])


@pytest.mark.parametrize("source,stop", [(PHI3, "<|end|>"), (MISTRAL, "</s>"), (OLMO, "</s>"), (LLAMA3, "<|eot_id|>")])
def test_generation_stops_at_the_templates_own_end_of_answer(source, stop):
    assert JinjaTemplate(source, SPECIAL).stop_text == stop
