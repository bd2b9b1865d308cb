"""Which settings changed between a checkpoint and the run's config.yaml, and which of them a resume accepts.

Every checkpoint records the whole config it was trained with (a few kilobytes) and its hash: SHA-256 of
the canonical JSON of the pydantic dump. `trainwise resume` compares that with config.yaml. Any difference is
refused and named field by field (`train.batch_size: 64 → 32`): a truncated or edited config.yaml must not
continue a run with other settings, or with sections silently back at their defaults.

`--allow-config-change` accepts the changes in `SAFE_TO_CHANGE` only: settings that say how long to train,
how often to log, evaluate or checkpoint, how the data is loaded, and what telemetry records. They change
neither the model, the data, the optimizer nor what `best` means, so the checkpoint stays a valid start.
Everything else (batch size, learning rate, model, data, precision, the monitored metric, ...) is still
refused with the flag: train a new run instead.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from trainwise.config.schema import RunConfig
from trainwise.errors import ConfigError

# Dotted fields (or whole sections, ending in `.*`) a resume may change with --allow-config-change.
SAFE_TO_CHANGE: dict[str, str] = {
    "name": "a label for reports",
    "train.max_steps": "how long to train (must end after the checkpoint's step)",
    "train.epochs": "how long to train (must end after the checkpoint's step)",
    "train.log_every": "how often metrics are logged",
    "train.sanity": "whether the pre-training checks run",
    "train.dist_timeout_s": "how long a rank waits for the others",
    "eval.every_steps": "how often validation runs",
    "eval.every_epoch": "how often validation runs",
    "eval.early_stopping.patience": "how many evaluations without improvement end the run",
    "checkpoint.every_steps": "how often checkpoints are written",
    "checkpoint.keep_last": "how many step checkpoints are kept",
    "data.num_workers": "how the data is loaded, not which data",
    "data.pin_memory": "how the data is loaded, not which data",
    "telemetry.*": "what the telemetry sampler records",
}

ABSENT = "(absent)"


def canonical_config(config: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready dump of a config, as checkpoints store it."""
    return config.model_dump(mode="json") if isinstance(config, RunConfig) else config


def config_hash(config: RunConfig | dict[str, Any]) -> str:
    """SHA-256 of the config's canonical JSON (sorted keys, no spaces): equal configs, equal hashes."""
    text = json.dumps(canonical_config(config), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def config_record(config: RunConfig) -> dict[str, Any]:
    """What a checkpoint stores about its config: the dump, to name changed fields, and its hash."""
    dump = canonical_config(config)
    return {"config": dump, "config_hash": config_hash(dump)}


@dataclass(frozen=True)
class ConfigChange:
    path: str
    old: Any
    new: Any
    missing: bool = False  # the field is not in config.yaml at all: the file was cut, the value is a default

    def __str__(self) -> str:
        return f"{self.path}: {_show(self.old)} → {_show(self.new)}" + (
            " (missing from config.yaml, so back at its default)" if self.missing else "")

    @property
    def safe(self) -> bool:
        """Accepted with --allow-config-change: an allowed field, set in config.yaml (config.yaml is written
        with every field filled in, so a missing one is damage, never a choice)."""
        return not self.missing and is_safe_to_change(self.path)


def is_safe_to_change(path: str) -> bool:
    return path in SAFE_TO_CHANGE or any(
        pattern.endswith(".*") and path.startswith(pattern[:-1]) for pattern in SAFE_TO_CHANGE)


def diff_configs(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[ConfigChange]:
    """Every leaf that differs, as dotted paths (mappings are walked; lists and values compare whole)."""
    changes: list[ConfigChange] = []
    for key in list(old) + [k for k in new if k not in old]:
        path = f"{prefix}{key}"
        before, after = old.get(key, ABSENT), new.get(key, ABSENT)
        if isinstance(before, dict) and isinstance(after, dict):
            changes += diff_configs(before, after, f"{path}.")
        elif before != after:
            changes.append(ConfigChange(path, before, after))
    return changes


def check_resume_config(stored: dict[str, Any], current: RunConfig, *, allow_change: bool, checkpoint: str,
                        step: int, written: dict[str, Any] | None = None) -> list[ConfigChange]:
    """The changes from the checkpoint's config `stored` to `current` that a resume accepts (none without
    `allow_change`); ConfigError naming each change that it does not. `written`: config.yaml as parsed, to
    tell a field set to a new value from one missing from the file."""
    changes = diff_configs(stored, canonical_config(current))
    if written is not None:
        changes = [ConfigChange(c.path, c.old, c.new, missing=not _is_set(written, c.path)) for c in changes
                   if not (c.old == ABSENT and not _is_set(written, c.path))]  # a field newer than both files
    if not changes:
        return []
    listed = "\n".join(f"  {change}" for change in changes)
    damage = (" config.yaml is written with every field filled in: fields missing from it mean the file was cut "
              "short or damaged; restore it from a copy.") if any(c.missing for c in changes) else ""
    if not allow_change:
        if all(c.safe for c in changes):
            safe = [c.path for c in changes]
            hint = (f" Only {', '.join(safe)} may change mid-run: resume with --allow-config-change to accept "
                    + ("them." if len(safe) > 1 else "it."))
        else:
            hint = (" Restore config.yaml to the values it was trained with (the checkpoint's are on the left), "
                    "or train a new run with the new settings." + damage)
        raise ConfigError(f"config.yaml differs from the config {checkpoint} was trained with:\n{listed}\n"
                          f"A resume continues the same run, so it refuses other settings.{hint}")
    unsafe = [c for c in changes if not c.safe]
    if unsafe:
        raise ConfigError(
            "config.yaml changes settings a run cannot change mid-way, even with --allow-config-change:\n"
            + "\n".join(f"  {change}" for change in unsafe)
            + f"\nRestore them to the checkpoint's values (on the left), or train a new run.{damage} Changes a "
            f"resume accepts, when set in config.yaml: {', '.join(SAFE_TO_CHANGE)}.")
    _check_length(current, step, checkpoint)
    return changes


def _check_length(current: RunConfig, step: int, checkpoint: str) -> None:
    max_steps = current.train.max_steps
    if max_steps is not None and max_steps <= step:
        raise ConfigError(f"train.max_steps={max_steps} ends before {checkpoint}'s step {step}: nothing is left "
                          f"to train. Set train.max_steps above {step} in config.yaml.")


def _is_set(raw: dict[str, Any], path: str) -> bool:
    node: Any = raw
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _show(value: Any) -> str:
    """As YAML and JSON write it: true, null, "val/loss", [8, 16]."""
    return ABSENT if value == ABSENT else json.dumps(value)
