"""The one error family users read.

The CLI turns a `TrainwiseError` into its message and exit code 2 with no traceback. Anything else that
escapes is a bug in trainwise and keeps its traceback.
"""
from __future__ import annotations


class TrainwiseError(Exception):
    """Something the user can fix: the message says what happened and what to do."""

    exit_code = 2


class ConfigError(TrainwiseError):
    """A recipe, an override or a file the user gave is not valid."""


class DataError(TrainwiseError):
    """The data cannot be used as given (bad labels, a corrupt shard, a missing split)."""


class RunDirError(TrainwiseError):
    """A run directory is missing, incomplete, or would be overwritten."""


class TrainingError(TrainwiseError):
    """Training stopped for a reason the user must act on (non-finite loss, out of memory)."""
