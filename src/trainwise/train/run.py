"""Runs from a config: build the data and the model it names, train into a run directory, resume one."""
from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from trainwise.config import RunConfig
from trainwise.data.bundle import check_labels
from trainwise.errors import RunDirError, RunDirWarning
from trainwise.recipes.factories import build_data, build_model
from trainwise.run import RunDir
from trainwise.run_trust import require_trust
from trainwise.train.callbacks import Callback
from trainwise.train.live_diagnosis import SanityFindings
from trainwise.train.checkpoint import latest_checkpoint
from trainwise.train.distributed import launched_ranks
from trainwise.train.trainer import Trainer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def build_trainer(config: RunConfig, run: RunDir, callbacks: Sequence[Callback] = ()) -> Trainer:
    """Seed, build the data (bad labels are refused here), the model and the trainer. Nothing is written."""
    seed_everything(config.seed)
    bundle = build_data(config)
    check_labels(bundle)
    findings = []
    if config.train.sanity:  # a run that cannot learn is not started (trainwise check shows the same)
        from trainwise.diagnose.sanity import raise_for_errors, sanity_check

        findings = sanity_check(config, bundle)
        raise_for_errors(findings)
    model = build_model(config, bundle.spec)
    callbacks = [*callbacks, SanityFindings(findings)]
    return Trainer(model, bundle.train, bundle.val, config=config, run_dir=run, callbacks=callbacks,
                   data_spec=bundle.spec, augment=bundle.augment)


def train_run(config: RunConfig, out: str | Path, *, overwrite: bool = False,
              callbacks: Sequence[Callback] = ()) -> RunDir:
    """Train `config` into a new run directory `out` (refused when it holds files, unless `overwrite`)."""
    run = RunDir(out)
    main = launched_ranks().is_main
    if main:
        RunDir.refuse_existing(run.path, overwrite=overwrite)  # fail fast, before any work
    trainer = build_trainer(config, run, callbacks)  # every check passes before anything is replaced
    if main:
        warning = run.check_free_space(trainer.checkpoint_bytes(), config.checkpoint.keep_last)
        if warning:
            warnings.warn(warning, RunDirWarning, stacklevel=2)
        run.initialise(overwrite=overwrite)
    trainer.fit()
    return trainer.run_dir


def resume_run(path: str | Path, callbacks: Sequence[Callback] = (), *, trust_code: bool = False) -> RunDir:
    """Continue a run from its last checkpoint, with the config it was started with. A run made by someone
    else that names factories runs none of them without `trust_code`."""
    run = RunDir.open(path)
    require_trust(run, run.read_config(), trust_code=trust_code, command="resume")  # before the lock says "us"
    if launched_ranks().is_main:
        run.acquire_writer()  # one writer per run directory: a second resume is refused here
    if run.read_summary().get("status") == "completed":
        raise RunDirError(f"{run.path} already completed; there is nothing to resume. Train a new run with "
                          "more steps, or evaluate this one with `trainwise eval`.")
    config = run.read_config()
    # no checkpoint to trust at all: say so before building anything
    latest_checkpoint(run, sharded=config.train.strategy == "fsdp")
    trainer = build_trainer(config, run, callbacks)
    trainer.fit(resume=True)
    return run
