"""The options of `trainwise prepare`, every kind's: what changes the prepared bytes."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainwise.data import interactions as interaction_kind
from trainwise.errors import DataError

Kind = Literal["auto", "images", "table", "interactions", "text"]


@dataclass(frozen=True)
class PrepareOptions:
    """Everything that changes the prepared bytes (the fingerprint cache compares these)."""

    kind: Kind = "auto"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 0
    shard_size: int | None = None        # samples per shard; default: what fits in SHARD_BYTES
    size: str = "64"                     # images: height x width after resize + center crop
    channels: int = 3                    # images: 3 (RGB) or 1 (grayscale)
    label: str | None = None             # tables: label column
    task: str = "auto"                   # tables: auto | classification | regression
    user_col: str | None = None          # interactions
    item_col: str | None = None
    time_col: str | None = None
    target_col: str | None = None
    split: str = "time"                  # interactions: time | last-k
    last_k: int = 1
    event_col: str | None = None         # interactions: behaviour type (view/cart/buy); default: `event`...
    session_gap: str | None = None       # interactions: a pause this long (e.g. 30m) starts a new session
    keep_duplicates: bool = False        # interactions: keep events repeated exactly (default: drop them)
    encoding: str | None = None          # tables and logs that are not UTF-8 (e.g. latin-1)
    numeric: str | None = None           # tables: columns to read as numbers (comma-separated)
    categorical: str | None = None       # tables: columns to read as categories
    max_image_pixels: int | None = None  # images: larger ones are skipped (default: Pillow's bomb limit)
    tokenizer: str | None = None         # text: `bytes` (default) or a tokenizer / model directory
    train_tokenizer: int | None = None   # text: train a byte-level BPE of this many ids on the training split
    text_field: str = "text"             # text: the field of a JSONL record holding the document
    seq_len: int | None = None           # text: context length the length report is made for (None: suggest)
    chat_format: str = "auto"            # instruction data: auto | alpaca | sharegpt | messages | prompt-completion
    template: str | None = None          # instruction data: a built-in chat template; None: the tokenizer's
    too_long: str = "truncate"           # instruction data: over seq_len, truncate the prompt or drop
    mask_prompt: bool = True             # instruction data: only the assistant's tokens carry loss
    test_file: str | None = None         # text and instruction data: a file (or folder) that is the test split

    def check(self) -> None:
        if not (0 <= self.val_fraction < 1 and 0 <= self.test_fraction < 1) or \
                self.val_fraction + self.test_fraction >= 0.9:
            raise DataError(f"--val-fraction {self.val_fraction:g} + --test-fraction {self.test_fraction:g}: each "
                            "in [0, 1) and together under 0.9, so training keeps at least 10%.")
        if self.channels not in (1, 3):
            raise DataError(f"--channels {self.channels}: use 3 (RGB) or 1 (grayscale).")
        if self.shard_size is not None and self.shard_size < 1:
            raise DataError(f"--shard-size {self.shard_size}: a shard holds at least one sample.")
        if self.task not in ("auto", "classification", "regression"):
            raise DataError(f"--task {self.task!r}: use auto, classification or regression.")
        if self.session_gap is not None:
            interaction_kind.parse_duration(self.session_gap)
        if self.last_k < 0:
            raise DataError(f"--last-k {self.last_k}: give how many of each user's last events to hold out, 1 or more.")
        if self.max_image_pixels is not None and self.max_image_pixels < 1:
            raise DataError(f"--max-image-pixels {self.max_image_pixels}: give a pixel count, e.g. 200000000.")
        if self.too_long not in ("truncate", "drop"):
            raise DataError(f"--too-long {self.too_long!r}: use truncate (cut the prompt's start) or drop.")
        if self.chat_format not in ("auto", "alpaca", "sharegpt", "messages", "prompt-completion"):
            raise DataError(f"--format {self.chat_format!r}: use auto, alpaca, sharegpt, messages or "
                            "prompt-completion.")
        self._check_text_options()

    def _check_text_options(self) -> None:
        if self.seq_len is not None and self.seq_len < 2:
            raise DataError(f"--seq-len {self.seq_len}: a context holds at least 2 tokens (one read, one "
                            "predicted); give the length you will train with (e.g. 512), or leave it out to have "
                            "one suggested from the documents.")
        if self.train_tokenizer is not None and self.tokenizer not in (None, "bytes"):
            raise DataError("--tokenizer and --train-tokenizer are exclusive: train a BPE, or use a given one.")
        if self.test_file is not None and not Path(self.test_file).expanduser().exists():
            raise DataError(f"--test-file {self.test_file}: no such file or folder. Give the held-out rows (or text "
                            "files) in the training source's format; they become the test split.")
        if self.tokenizer not in (None, "bytes") and not Path(self.tokenizer).expanduser().exists():
            raise DataError(f"--tokenizer {self.tokenizer}: no such directory. Give `bytes` (the default) or a "
                            "local model or tokenizer directory (one holding tokenizer.json or "
                            "tokenizer_config.json); nothing is downloaded.")

    def check_kind(self, kind: str) -> None:
        """What the detected kind of source makes invalid (checked before anything is written)."""
        if kind != "text" and self.test_file is not None:
            raise DataError(f"--test-file {self.test_file}: a held-out file is for text and instruction data; this "
                            f"source is prepared as {kind}, split by --val-fraction and --test-fraction.")
        if kind == "text" and self.encoding is not None:
            raise DataError(f"--encoding {self.encoding}: text and chat sources are read as UTF-8 (JSON and "
                            "Parquet are UTF-8 by definition); --encoding is for tables and interaction logs. "
                            f"Convert the files first, e.g. `iconv -f {self.encoding} -t utf-8 IN > OUT`, then "
                            "prepare OUT.")


def held_out_file(source: Path, options: PrepareOptions) -> Path | None:
    """`--test-file`: the file (or folder) whose rows or documents are the test split; None without one. One inside
    the source would be read as training data too, so it is refused."""
    if options.test_file is None:
        return None
    held = Path(options.test_file).expanduser().resolve()
    where = source.resolve()
    if held == where or where in held.parents:
        what = "the source itself" if held == where else f"inside the source {source}"
        raise DataError(f"--test-file {options.test_file} is {what}: its rows would train too. Move the held-out "
                        "file out of the training source.")
    return held


def test_file_note(options: PrepareOptions, count: int, unit: str) -> str:
    """What `prepare` says of the test split a --test-file made."""
    also = f", and {options.test_fraction:g} of the source's held out at random" if options.test_fraction else ""
    return f"test split: the {count:,} {unit} of --test-file {options.test_file}{also}"
