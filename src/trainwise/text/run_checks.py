"""Before step 1 of a language-model run: the data, the model and the run must agree, or the run is refused with
one message (ConfigError, exit 2) instead of failing inside a step.

- the tokenizer: a run keeps the tokenizer its data was made with (RUN/tokenizer); data re-prepared since with
  another tokenizer has ids that mean other words, so a resume (or an evaluation) on it is refused as such;
- the vocabulary: the model must embed every id the data holds;
- the context: `data.seq_len` above the model's position table (`max_position_embeddings`, `n_positions`, the
  built-in gpt's `context`) would index past it;
- instruction samples longer than `data.seq_len` are cut at training time and their answers then train
  without their prompt: not refused (it may be meant), but counted and said.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from trainwise.errors import ConfigError
from trainwise.data.text.tokenizer import KIND_FILE, TOKENIZER_FILES

CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "context")  # HF configs, the built-in gpt's
# Below these an epoch-driven run (sft-lora's shape) ends before an adapter learns much, yet reports `completed`.
MIN_RUN_STEPS = 50
MIN_EPOCH_STEPS = 10


def check_language_run(bundle: Any, model: Any, kept_tokenizer: Path | None = None) -> list[str]:
    """Refuse a run whose data, model and kept tokenizer disagree (ConfigError); the warnings to say. `bundle`:
    the run's DataBundle (text), `model` as built, `kept_tokenizer`: RUN/tokenizer when the run has one."""
    spec = bundle.spec
    if spec.task != "causal_lm":
        return []
    seq_len = int(spec.input_shape[0])
    check_kept_tokenizer(kept_tokenizer, spec.tokenizer_fingerprint, bundle.notes.get("prepared"))
    _check_vocabulary(model, int(spec.num_classes))
    _check_context(model, seq_len)
    return _unchecked_tokenizer(model, bundle.train) + cut_sample_warnings(bundle.train, seq_len)


def check_kept_tokenizer(kept: Path | None, data_fingerprint: str | None, data_path: str | None) -> None:
    """The tokenizer a run started with (RUN/tokenizer) against the one its data holds now."""
    if kept is None or data_fingerprint is None:
        return
    try:
        recorded = json.loads((Path(kept) / KIND_FILE).read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return  # a run without a recorded fingerprint: the checkpoint's shapes still decide
    if recorded and recorded != data_fingerprint:
        raise ConfigError(
            f"the data at {data_path or 'data.path'} was re-prepared with another tokenizer since this run trained "
            f"(the data's tokenizer fingerprint {data_fingerprint[:12]}, the run's {recorded[:12]}): its ids mean "
            "other words to this model. Prepare the data again with the run's tokenizer (`--tokenizer "
            f"{kept}`), or train a new run on the new data.")


def _check_vocabulary(model: Any, ids: int) -> None:
    embeddings = getattr(model, "get_input_embeddings", None)
    table = embeddings() if callable(embeddings) else getattr(model, "wte", None)
    rows = getattr(table, "num_embeddings", None)
    if rows is not None and rows < ids:
        raise ConfigError(f"the data's tokenizer has {ids:,} ids but the model embeds {rows:,}: ids above "
                          f"{rows - 1:,} have no row. Prepare the data with the model's tokenizer (--tokenizer "
                          "MODEL_DIR).")


def _unchecked_tokenizer(model: Any, train: Any) -> list[str]:
    """A pretrained model directory without a tokenizer: its ids cannot be compared with the data's."""
    directory = Path(str(getattr(getattr(model, "config", None), "name_or_path", "") or ""))
    if not str(directory) or not (directory / "config.json").is_file() or \
            any((directory / name).is_file() for name in TOKENIZER_FILES):
        return []
    kind = ((getattr(getattr(train, "stream", None), "manifest", None) or {}).get("tokenizer") or {}).get("kind")
    return [f"model.hf={directory} holds no tokenizer, so trainwise cannot check that the data's ids (tokenizer: "
            f"{kind or 'unknown'}) are the model's; unless the model was trained on this tokenizer, put its "
            "tokenizer files beside the weights and prepare the data with --tokenizer pointing there."]


def model_context(model: Any) -> int | None:
    """The longest sequence the model's position table holds, from its config; None when it says none."""
    config = getattr(model, "config", None)
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_context(model: Any, seq_len: int) -> None:
    context = model_context(model)
    if context is not None and seq_len > context:
        raise ConfigError(f"data.seq_len {seq_len:,} is above the model's context of {context:,} positions "
                          "(max_position_embeddings / n_positions): positions past it have no embedding. Set "
                          f"data.seq_len={context} or lower.")


def cut_sample_warnings(train: Any, seq_len: int) -> list[str]:
    """Instruction samples longer than `seq_len`: cut when packed, so their answers lose their prompt."""
    stream = getattr(train, "stream", None)
    instruct = (getattr(stream, "manifest", None) or {}).get("instruct")
    if not instruct:
        return []
    lengths = np.diff(np.asarray(stream.offsets))
    cut = int((lengths > seq_len).sum())
    if not cut:
        return []
    return [f"data.seq_len {seq_len:,} is below the length the instruction data was prepared for "
            f"({int(instruct['seq_len']):,}): {cut:,} of {len(lengths):,} training samples are longer and will be "
            f"cut, so their answers train without (all of) their prompt. Set data.seq_len={int(lengths.max())} "
            f"or prepare again with --seq-len {seq_len}."]


def short_run_warning(sequences: int, batch_size: int, epochs: float, seq_len: int) -> str | None:
    """An epoch-driven run of < MIN_RUN_STEPS optimizer steps, or epochs of < MIN_EPOCH_STEPS: the numbers and
    the levers. `sequences`: the training split's packed sequences (one epoch's samples)."""
    per_epoch = sequences // max(batch_size, 1)
    total = math.ceil(epochs * per_epoch)
    if total >= MIN_RUN_STEPS and per_epoch >= MIN_EPOCH_STEPS:
        return None
    return (f"this run trains only {total} optimizer steps: {epochs:g} epochs of {per_epoch} steps ({sequences:,} "
            f"packed sequences of {seq_len:,} tokens per epoch at train.batch_size={batch_size}); fewer than "
            f"{MIN_RUN_STEPS} steps, or epochs of fewer than {MIN_EPOCH_STEPS}, rarely teach a model the task. "
            "More steps: a smaller data.seq_len (prepare suggests one; fewer samples share a pack), a smaller "
            "train.batch_size, or more train.epochs.")
