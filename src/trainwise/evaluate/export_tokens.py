"""The tokens an export tells transformers about, so a plain `AutoModelForCausalLM.generate` stops where
trainwise's own generate does:

- the tokenizer written beside the weights: a BPE trained by `prepare`, the byte-level ids (as a byte-level
  BPE without merges: the same ids, 0..255 and 256 for end of text), or the model directory's own; its special
  tokens (end of text, a chat template's markers such as `<|im_start|>` / `<|im_end|>`) registered as special,
  so each encodes as one id and `decode(skip_special_tokens=True)` drops it;
- config.json's bos/eos/pad ids: the tokenizer's;
- generation_config.json's eos_token_id: every id that ends a reply: the end of text and, for a chat
  fine-tune, the template's end of turn (`[<|endoftext|>, <|im_end|>]`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.data.text.tokenizer import END_OF_TEXT, BpeTokenizer, ByteTokenizer, ModelTokenizer, Tokenizer


@dataclass(frozen=True)
class ExportTokens:
    bos: int | None
    eos: int | None  # config.json's eos_token_id: the tokenizer's own eos
    pad: int | None
    stops: tuple[int, ...]  # generation_config.json's eos_token_id: each id that ends a reply
    special: dict[str, int]  # the special tokens the exported tokenizer registers: text -> id
    warning: str = ""  # an end of turn that is several ids: transformers cannot stop at it

    def describe(self) -> str:
        names = {token_id: text for text, token_id in self.special.items()}
        stops = " or ".join(f"{names.get(i, '?')} ({i})" for i in self.stops)
        return f"generation stops at {stops}; bos {self.bos}, eos {self.eos}, pad {self.pad}"


def export_tokens(tokenizer: Tokenizer, template: Any, model: Any) -> ExportTokens:
    """The ids an export writes, from the run's tokenizer and chat template (None: plain text). With a model
    directory's own tokenizer, `model`'s (a pretrained one's; None: none) bos and end ids that are special tokens
    of that tokenizer stay (Llama 3's several ends)."""
    special = special_tokens(tokenizer)
    end_text = tokenizer.separator_id
    bos = eos = pad = end_text
    kept: list[int] = []
    if isinstance(tokenizer, ModelTokenizer):
        backend, ids = tokenizer.backend, set(special.values())
        config = getattr(model, "config", None)
        own = _listed(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        kept = [i for i in [*_listed(getattr(config, "eos_token_id", None)), *own] if i in ids]
        model_bos = getattr(config, "bos_token_id", None)
        bos = backend.bos_token_id if backend.bos_token_id is not None else (model_bos if model_bos in ids else None)
        eos, pad = tokenizer.eos_id, tokenizer.pad_id
    end_of_turn, warning = _end_of_turn(tokenizer, template, special)
    stops = tuple(dict.fromkeys(i for i in (eos, end_text, special.get(end_of_turn or ""), *kept) if i is not None))
    return ExportTokens(bos, eos, pad, stops, special, warning)


def special_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """The tokenizer's special tokens, text -> id (a BPE's: end of text and the template markers it was
    trained with; a model directory's: all it declares)."""
    if isinstance(tokenizer, ModelTokenizer):
        backend = tokenizer.backend
        return dict(zip(backend.all_special_tokens, backend.all_special_ids))
    if isinstance(tokenizer, BpeTokenizer):
        added = tokenizer.backend.get_added_tokens_decoder()
        return {token.content: token_id for token_id, token in sorted(added.items()) if token.special}
    return {END_OF_TEXT: tokenizer.eos_id} if tokenizer.eos_id is not None else {}


def _end_of_turn(tokenizer: Tokenizer, template: Any, special: dict[str, int]) -> tuple[str | None, str]:
    """The template's end of turn where it is one special id; otherwise a warning saying what follows."""
    stop = getattr(template, "stop_text", None) if template is not None else None
    if not stop:
        return None, ""
    ids = tokenizer.encode(stop)
    if len(ids) == 1 and ids[0] in special.values():
        return stop, ""
    fix = ("prepare the chat data again (`--train-tokenizer` now makes the template's markers one id each) and "
           "train again" if isinstance(tokenizer, BpeTokenizer) else
           "use a tokenizer that has it as a token, or its own chat template (leave --template out)")
    return None, (f"The chat template's end of turn {stop!r} is {len(ids)} ids in this tokenizer, not one special "
                  "token: transformers' generate cannot stop at it, only at the end of text the model learned "
                  f"after a conversation's last answer. For a one-id end of turn, {fix}.")


def _listed(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def apply_ids(model: Any, tokens: ExportTokens) -> None:
    """config.json and generation_config.json of `model` (a transformers model) say the tokenizer's ids."""
    for target in (model.config, getattr(model, "generation_config", None)):
        if target is None:
            continue
        target.bos_token_id, target.pad_token_id = tokens.bos, tokens.pad
        target.eos_token_id = tokens.eos
    if getattr(model, "generation_config", None) is not None and tokens.stops:
        model.generation_config.eos_token_id = list(tokens.stops) if len(tokens.stops) > 1 else tokens.stops[0]


def save_tokenizer(tokenizer: Tokenizer, directory: Path, tokens: ExportTokens, context: int | None) -> str:
    """Write the tokenizer in transformers' form (tokenizer.json + tokenizer_config.json); what was saved."""
    if isinstance(tokenizer, ModelTokenizer):
        tokenizer.backend.save_pretrained(str(directory))
        return "the model directory's tokenizer"
    from trainwise.llm.optional import require

    transformers = require("transformers", "exporting a tokenizer")
    backend = tokenizer.backend if isinstance(tokenizer, BpeTokenizer) else byte_level_backend()
    markers = [text for text in tokens.special if text != END_OF_TEXT]
    # transformers 5 names the list extra_special_tokens; 4.x additional_special_tokens
    key = "extra_special_tokens" if int(transformers.__version__.split(".")[0]) >= 5 else "additional_special_tokens"
    options = {key: markers} if markers else {}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT,
                                                pad_token=END_OF_TEXT, model_max_length=context or int(1e30),
                                                **options)
    fast.save_pretrained(str(directory))
    if isinstance(tokenizer, ByteTokenizer):
        return "byte-level (UTF-8 bytes 0..255, end of text 256), as a tokenizer.json transformers reads"
    return "the BPE trained by trainwise prepare"


def byte_level_backend() -> Any:
    """The byte-level ids as a `tokenizers` tokenizer: each UTF-8 byte its own id (a byte-level BPE with no
    merges), `<|endoftext|>` 256."""
    from trainwise.llm.optional import require

    tokenizers = require("tokenizers", "exporting a byte-level tokenizer")
    vocab = {character: byte for byte, character in byte_characters().items()}
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    backend.add_special_tokens([tokenizers.AddedToken(END_OF_TEXT, special=True, normalized=False)])
    return backend


def byte_characters() -> dict[int, str]:
    """The byte-level alphabet `tokenizers` writes bytes in: a printable byte stands for itself, the others
    (controls, space, 127..160, 173) for the characters from 256 on, in byte order."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    shifted = iter(range(256, 512))
    return {byte: chr(byte) if byte in printable else chr(next(shifted)) for byte in range(256)}
