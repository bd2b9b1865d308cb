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


class FactoryError(ConfigError):
    """The user's own `module:function` factory raised: the message names it and its arguments, then shows
    the user's traceback (the error is in their code, so they need to see where)."""


class DataError(TrainwiseError):
    """The data cannot be used as given (bad labels, a corrupt shard, a missing split)."""


class RunDirError(TrainwiseError):
    """A run directory is missing, incomplete, or would be overwritten."""


class TrainingError(TrainwiseError):
    """Training stopped for a reason the user must act on (non-finite loss, out of memory)."""


class RunInUseError(RunDirError):
    """Another live process is writing the run directory (it holds the run's lock)."""


class DamagedFileError(RunDirError):
    """A file of a run directory is not what was written (checksum mismatch, cut short, not readable)."""


class DiskFullError(RunDirError):
    """A write ran out of disk space. The partial file was removed; the previous version is intact."""

    def __init__(self, directory: object, free_bytes: int, needed_bytes: int, what: str = "this file", *,
                 at_least: bool = False, advice: str = ""):
        self.directory, self.free_bytes, self.needed_bytes = directory, free_bytes, needed_bytes
        self._what, self._kwargs = what, {"at_least": at_least, "advice": advice}
        needs = f"{'at least ' if at_least else ''}{self.mib(needed_bytes)} MiB"
        super().__init__(f"no space left on {directory} ({self.mib(free_bytes)} MiB free, {what} needs {needs})."
                         + (f" {advice}" if advice else ""))

    def __reduce__(self):  # keyword-only arguments: the default pickling would lose them
        return DiskFullError._rebuild, (self.directory, self.free_bytes, self.needed_bytes, self._what, self._kwargs)

    @staticmethod
    def _rebuild(directory, free_bytes, needed_bytes, what, kwargs) -> "DiskFullError":
        return DiskFullError(directory, free_bytes, needed_bytes, what, **kwargs)

    @staticmethod
    def mib(n: int) -> str:
        """Bytes as MiB for a message: whole MiB from 10 up, one decimal below (a 0.7 MiB checkpoint)."""
        mib = n / 2**20
        return f"{mib:.0f}" if mib >= 10 else f"{mib:.1f}"


class TrainwiseWarning(UserWarning):
    """Something trainwise chose or skipped that the person should know: one line at the terminal."""


class RunDirWarning(TrainwiseWarning):
    """A run directory holds something a reader skipped (a malformed record, a damaged summary)."""


class ConfigWarning(TrainwiseWarning):
    """A setting the recipe gave, fitted to the run the overrides ask for (a warmup longer than the run)."""




class ModelCallError(TrainwiseError):
    """The model's forward or the loss raised on a real batch: a mismatch between the model, the data and
    the loss (shapes, dtypes, label range) or a bug in the user's module. The message names the model, the
    batch and the step, then shows the traceback from the model's code: the person needs to see where."""

    @classmethod
    def during(cls, what: str, model: str, step: int, inputs, error: BaseException,
               outputs=None) -> "ModelCallError":
        import re
        import traceback

        label = re.search(r"Target (-?\d+) is out of bounds", str(error))
        if label and outputs is not None and getattr(outputs, "ndim", 0) >= 2:
            # the data's fault, not the model's code: no traceback, the two numbers and the fix
            classes = outputs.shape[-1]
            return cls(f"label {label.group(1)} is out of range for {model}, which has {classes} outputs "
                       f"(classes 0 to {classes - 1}), at step {step}. Give the model one output per class "
                       "(set the recipe's number of classes, e.g. model.args.num_classes, to the largest label "
                       "+ 1), or fix the labels (they must be 0 to classes - 1).")
        shape = tuple(getattr(inputs, "shape", ()))
        dtype = str(getattr(inputs, "dtype", "?")).removeprefix("torch.")
        first = next(iter(str(error).splitlines()), "")
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename.endswith(("trainwise/train/step/train_step.py",)):
            tb = tb.tb_next  # start at the model's (or loss's) own frames
        shown = "".join(traceback.format_exception(type(error), error, tb)).rstrip()
        return cls(f"{what} of {model} raised {type(error).__name__} at step {step} on a micro-batch of inputs "
                   f"{shape} {dtype}: {first}\nCheck that the model fits the data (input shape, number of "
                   f"classes, label range); `trainwise explain error.log` reads the traceback.\n{shown}")
