"""Tokenizers behind one small interface: byte-level, a BPE trained locally, or a model directory's own.

- `ByteTokenizer`: the 256 byte values plus one end-of-text id (256); nothing to download or train.
- `BpeTokenizer`: a byte-level BPE trained here with the `tokenizers` library (`--train-tokenizer 8000`).
- `ModelTokenizer`: the tokenizer of a local Hugging Face model directory, through transformers.

Every tokenizer saves itself into a directory (`save(dir)`, read back by `load_tokenizer(dir)`) and has a
`fingerprint`: a sha256 of what decides its ids. A prepared text dataset records it, so tokens are never
read with another tokenizer than the one that made them.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trainwise.rundir.atomic import atomic_write_json, atomic_write_text
from trainwise.errors import ConfigError, DataError

KIND_FILE = "trainwise_tokenizer.json"  # which of the kinds below a saved tokenizer directory holds
SEQUENCE_FILE = "trainwise_sequence.json"  # a run's copy: the sequence length its model was built for
END_OF_TEXT = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")  # what a model directory's tokenizer is saved as


def optional_module(name: str):
    """Import an optional language-model package, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(f"this needs the `{name}` package, part of the language-model extra: "
                          "pip install 'trainwise[llm]'") from None


class Tokenizer:
    """encode(str) -> ids, decode(ids) -> str, and what a model and a dataset need to know."""

    kind = ""
    vocab_size: int
    eos_id: int | None
    pad_id: int | None
    chat_template: str | None = None

    @property
    def separator_id(self) -> int | None:
        """The id that ends a plain-text document: the end-of-text (most tokenizers' eos)."""
        return self.eos_id

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    @property
    def max_id(self) -> int:
        """The largest id this tokenizer can emit (what the token shards' storage type must hold)."""
        return self.vocab_size - 1

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.kind}\n{self._identity()}".encode()).hexdigest()

    def _identity(self) -> str:
        raise NotImplementedError

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_files(directory)
        atomic_write_json(directory / KIND_FILE, {"kind": self.kind, "fingerprint": self.fingerprint,
                                                  "vocab_size": self.vocab_size, "eos_id": self.eos_id})
        return directory

    def _save_files(self, directory: Path) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        """What a manifest or a run records about the tokenizer."""
        return {"kind": self.kind, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "pad_id": self.pad_id}


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, and 256 for the end of a document."""

    kind = "bytes"
    vocab_size = 257
    eos_id = 256
    pad_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def _identity(self) -> str:
        return "utf-8 bytes 0..255, end of text 256"


class BpeTokenizer(Tokenizer):
    """A byte-level BPE (`tokenizers.Tokenizer`) with `<|endoftext|>` as its end-of-text and padding id."""

    kind = "bpe"

    def __init__(self, backend: Any):
        self.backend = backend
        self.vocab_size = max(backend.get_vocab_size(), max(backend.get_vocab().values(), default=-1) + 1)
        self.eos_id = self.pad_id = backend.token_to_id(END_OF_TEXT)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, markers: Sequence[str] = ()) -> "BpeTokenizer":
        """Learn merges from `texts` (deterministic for the same texts and size). `markers`: a chat template's
        markup (`<|im_start|>`, `<|im_end|>`), each one special id: merges never cross the byte-level
        pre-tokenizer's splits at `<|`, so a marker learned as text stays ~5 ids and cannot be an eos."""
        if vocab_size < 258:
            raise ConfigError(f"--train-tokenizer {vocab_size}: a byte-level BPE needs at least 258 ids (256 bytes, "
                              "end of text and one merge); 8000 is a good size for a few MB of text.")
        tokenizers = optional_module("tokenizers")
        backend = tokenizers.Tokenizer(tokenizers.models.BPE())
        backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[END_OF_TEXT, *markers], show_progress=False,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
        backend.train_from_iterator(texts, trainer=trainer)
        return cls(backend)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.backend.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        # the end of text is dropped, a template's markers are kept (the text a reply is cut at)
        return self.backend.decode([i for i in ids if i != self.eos_id], skip_special_tokens=False)

    def _identity(self) -> str:
        return self.backend.to_str()

    def _save_files(self, directory: Path) -> None:
        atomic_write_text(directory / "tokenizer.json", self.backend.to_str())


class ModelTokenizer(Tokenizer):
    """A Hugging Face tokenizer from a local directory (no download). Special tokens are not added by
    `encode`: packing appends the end-of-text id itself, so each document is followed by exactly one."""

    kind = "hf"

    def __init__(self, backend: Any):
        self.backend = backend
        # ids need not be dense: a vocabulary may hold an id above len(tokenizer) (a model's reserved rows)
        largest = max([*backend.get_vocab().values(), *getattr(backend, "added_tokens_decoder", {})], default=-1)
        self.vocab_size = max(len(backend), largest + 1)
        self.eos_id = backend.eos_token_id
        self.pad_id = backend.pad_token_id if backend.pad_token_id is not None else backend.eos_token_id
        self.chat_template = getattr(backend, "chat_template", None)

    @property
    def separator_id(self) -> int | None:
        """The model's document separator: `<|endoftext|>` where the vocabulary has it. A chat model's eos is
        often its end-of-turn (`<|im_end|>`, Qwen/SmolLM): plain text is not a turn, so it is not ended by one."""
        separator = self.backend.convert_tokens_to_ids(END_OF_TEXT)
        unknown = getattr(self.backend, "unk_token_id", None)
        return separator if isinstance(separator, int) and separator != unknown else self.eos_id

    @classmethod
    def from_directory(cls, path: str | Path) -> "ModelTokenizer":
        from trainwise.llm.gguf import model_directory  # a GGUF file's converted copy; a directory as it is

        path = model_directory(path)
        if not path.is_dir():
            raise ConfigError(f"{path}: not a directory; give a local model directory holding its tokenizer "
                              "(tokenizer.json or tokenizer_config.json).")
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            held = "a config.json but " if (path / "config.json").is_file() else ""
            raise ConfigError(f"{path}: holds {held}no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}). Give "
                              "the directory the model's tokenizer is in (an export keeps it beside the weights), "
                              "or use --tokenizer bytes / --train-tokenizer 8000.")
        transformers = optional_module("transformers")
        try:
            backend = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as error:  # a malformed tokenizer.json raises KeyError, TypeError, tokenizers' own...
            raise DataError(f"{path}: its tokenizer files cannot be read by transformers ({type(error).__name__}: "
                            f"{str(error)[:200]}); tokenizer.json or tokenizer_config.json is damaged or not a "
                            "tokenizer. Restore them from the model's source, or use --tokenizer bytes.") from None
        if len(backend) < 2:
            raise DataError(f"{path}: its tokenizer has {len(backend)} id; that is not a model's tokenizer. Give the "
                            "directory holding the model's tokenizer.json, or use --tokenizer bytes.")
        return cls(backend)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.backend(list(texts), add_special_tokens=False)["input_ids"]

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode(list(ids))

    def _identity(self) -> str:
        backend = getattr(self.backend, "backend_tokenizer", None)
        vocab = backend.to_str() if backend is not None else json.dumps(sorted(self.backend.get_vocab().items()))
        return f"{vocab}\n{self.chat_template or ''}"

    def _save_files(self, directory: Path) -> None:
        self.backend.save_pretrained(str(directory))


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """A tokenizer saved by `Tokenizer.save`, or a model directory's own tokenizer."""
    directory = Path(directory)
    kind_file = directory / KIND_FILE
    if not kind_file.is_file():
        return ModelTokenizer.from_directory(directory)
    try:
        saved = json.loads(kind_file.read_text())
        kind = saved["kind"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(f"{kind_file}: unreadable ({error}); prepare the dataset again.") from None
    if kind == "bytes":
        tokenizer: Tokenizer = ByteTokenizer()
    elif kind == "bpe":
        tokenizer = BpeTokenizer(_bpe_backend(directory / "tokenizer.json"))
    elif kind == "hf":
        tokenizer = ModelTokenizer.from_directory(directory)
    else:
        raise DataError(f"{kind_file}: unknown tokenizer kind {kind!r} (bytes, bpe or hf).")
    if saved.get("fingerprint") not in (None, tokenizer.fingerprint):
        raise DataError(f"{directory}: the tokenizer files changed since they were saved (fingerprint "
                        f"{tokenizer.fingerprint[:12]}, recorded {str(saved['fingerprint'])[:12]}); restore them or "
                        "prepare the dataset again.")
    return tokenizer


def _bpe_backend(path: Path) -> Any:
    tokenizers = optional_module("tokenizers")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the `tokenizers` library raises a bare Exception for a malformed file
        raise DataError(f"{path}: not a tokenizer file the `tokenizers` library can read ({str(error)[:200]}); "
                        "prepare the dataset again.") from None


def resolve_tokenizer(spec: str | None, train_size: int | None, texts: Iterable[str] | None = None,
                      markers: Sequence[str] = ()) -> Tokenizer:
    """What `trainwise prepare` was asked for: `--train-tokenizer N` (a BPE trained on `texts`, with `markers`
    as special ids), `--tokenizer bytes` (the default), or `--tokenizer DIR` (a model directory or a saved
    tokenizer)."""
    if train_size is not None:
        if spec not in (None, "bytes"):
            raise ConfigError("--tokenizer and --train-tokenizer are exclusive: train a BPE, or use a given one.")
        if texts is None:
            raise ConfigError("--train-tokenizer needs the text to train on.")
        return BpeTokenizer.train(texts, train_size, markers)
    if spec in (None, "bytes"):
        return ByteTokenizer()
    return load_tokenizer(spec)


def record_sequence_length(directory: Path, seq_len: int) -> None:
    """Beside a run's copy of its tokenizer: the sequence length the model trained with."""
    atomic_write_json(Path(directory) / SEQUENCE_FILE, {"seq_len": int(seq_len)})


def recorded_sequence_length(directory: Path) -> int | None:
    try:
        return int(json.loads((Path(directory) / SEQUENCE_FILE).read_text())["seq_len"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
