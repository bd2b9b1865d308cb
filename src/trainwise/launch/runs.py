"""Starting and resuming a run: decide what the config leaves open (resolve.py), build the data and the model
it names, run the sanity checks (trainwise.check), hand them to the engine (trainwise.train) and train into a
run directory; resume one from its checkpoint with the config it was started with."""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import yaml

from trainwise.config import RunConfig
from trainwise.config.diff import check_resume_config, config_hash
from trainwise.data.bundle import check_labels
from trainwise.errors import RunDirError, RunDirWarning
from trainwise.launch.resolve import record_built_length, resolve_run
from trainwise.plan.planner import device_peak_flops
from trainwise.recipes.factories import build_data, build_model
from trainwise.rundir.layout import RunDir
from trainwise.rundir.checkpoint_files import read_checkpoint_header, resume_checkpoint
from trainwise.rundir.integrity import CheckpointChoice
from trainwise.rundir.trust import require_trust
from trainwise.runtime.seed import seed_everything
from trainwise.train.callbacks.base import Callback
from trainwise.train.callbacks.live_diagnosis import SanityFindings
from trainwise.train.loop.run_task import ValidateAsBuilt
from trainwise.train.parallel.distributed import launched_ranks, leaving_the_job
from trainwise.train.callbacks.token_rates import PeakFlops
from trainwise.train.loop.trainer import Trainer


def build_trainer(config: RunConfig, run: RunDir, callbacks: Sequence[Callback] = (), *,
                  resuming: bool = False) -> Trainer:
    """Seed, build the data (bad labels are refused here), the model and the trainer. Nothing is written.
    `config` is resolved (resolve_run) for a new run, as recorded for a resume. `resuming`: the run's kept
    tokenizer is checked against the data's (a language model)."""
    config.train.refuse_unresolved_auto()  # before the data is built
    seed_everything(config.seed)
    bundle = build_data(config)
    check_labels(bundle)
    if not resuming:  # a resume keeps the config it recorded
        config = record_built_length(config, bundle)
    model = build_model(config, bundle.spec)
    findings = []
    if config.train.sanity:  # a run that cannot learn is not started (trainwise check shows the same)
        from trainwise.check.sanity import raise_for_errors, sanity_check

        findings = sanity_check(config, bundle, model)  # the probe trains this model and restores its weights
        raise_for_errors(findings)
    sanity = SanityFindings(findings)
    said = [sanity, PeakFlops(device_peak_flops)]  # the card's catalogue peak, for the run's MFU
    said += [ValidateAsBuilt()] if getattr(model, "counted", False) else []  # popularity: no step
    if bundle.notes.get("tokenizer"):  # text: the run keeps the tokenizer its data was made with
        from trainwise.train.callbacks.token_rates import KeepTokenizer, check_text_run

        check_text_run(bundle, model, run.tokenizer_dir() if resuming else None, None if resuming else config)
        said.append(KeepTokenizer(bundle.notes["tokenizer"], int(bundle.spec.input_shape[0])))
    trainer = Trainer(model, bundle.train, bundle.val, config=config, run_dir=run, callbacks=[*callbacks, *said],
                      data_spec=bundle.spec, augment=bundle.augment, built_from_config=True)
    if trainer.device.type == "cpu" and findings:  # a long CPU run is said before its first step, with the levers
        import torch

        from trainwise.check.sanity import slow_cpu_run

        slow = slow_cpu_run(findings, batch_size=config.train.batch_size, max_steps=trainer.max_steps,
                            threads=torch.get_num_threads(), full_softmax=trainer.profile is not None
                            and trainer.profile.kind == "next_item" and trainer.profile.loss != "sampled_softmax")
        sanity.findings += [slow] if slow is not None else []
    return trainer


def run_inputs(config: RunConfig, recipe_file: Path | None) -> list[Path]:
    """The user's files a run reads (`data.path`, the recipe file): never inside what `--overwrite` replaces."""
    return [Path(p) for p in (config.data.path, recipe_file) if p is not None]


def check_before_launch(config: RunConfig, ranks: int, out: Path | None = None, *, overwrite: bool = False,
                        recipe_file: Path | None = None) -> None:
    """What `--nproc N` can refuse before any rank starts, said once (ConfigError, RunDirError): a batch the
    ranks cannot share, a strategy that does not fit the job, an `--out` that holds files."""
    from trainwise.train.parallel.distributed import Ranks, resolve_strategy

    config.train.micro_batch_for(ranks)
    resolve_strategy(config.train.strategy, Ranks(world_size=ranks))
    if out is not None:
        RunDir.refuse_existing(out, overwrite=overwrite, inputs=run_inputs(config, recipe_file))


def train_run(config: RunConfig, out: str | Path, *, overwrite: bool = False,
              callbacks: Sequence[Callback] = (), recipe_file: Path | None = None) -> RunDir:
    """Train `config` into a new run directory `out` (refused when it holds files, unless `overwrite` and they
    are an earlier run's). What the config leaves `auto` or unset is decided first (resolve.py) and recorded in
    config.yaml. The recipe file and `data.path` are never inside what `overwrite` replaces."""
    run = RunDir(out)
    main = launched_ranks().is_main
    inputs = run_inputs(config, recipe_file)
    if main:
        RunDir.refuse_existing(run.path, overwrite=overwrite, inputs=inputs)  # fail fast, before any work
    with leaving_the_job():
        resolution = resolve_run(config)  # the same on every rank: see resolve.py
        trainer = build_trainer(resolution.config, run, callbacks)  # every check passes before anything is replaced
        if main:
            run.initialise(overwrite=overwrite, inputs=inputs)  # an --out that cannot be written: the error to show
            warning = run.check_free_space(trainer.checkpointer.size_bytes(), config.checkpoint.keep_last)
            if warning:
                warnings.warn(warning, RunDirWarning, stacklevel=2)
            for event in [resolution.event(), *resolution.events]:
                if event is not None:
                    run.log_event(**event, step=0)
        trainer.fit()
    return trainer.run_dir


def resume_run(path: str | Path, callbacks: Sequence[Callback] = (), *, trust_code: bool = False,
               allow_config_change: bool = False) -> RunDir:
    """Continue a run from its last checkpoint, with the config it was started with. A run made by someone
    else that names factories runs none of them without `trust_code`. A config.yaml that differs from the
    checkpoint's config is refused; `allow_config_change` accepts the few changes that are safe mid-run
    (config_diff.SAFE_TO_CHANGE)."""
    run = RunDir.open(path)
    require_trust(run, run.read_config(), trust_code=trust_code, command="resume")  # before the lock says "us"
    if launched_ranks().is_main:
        run.acquire_writer()  # one writer per run directory: a second resume is refused here
    if run.read_summary().get("status") == "completed":
        raise RunDirError(f"{run.path} already completed; there is nothing to resume. Train a new run with "
                          "more steps, or evaluate this one with `trainwise eval`.")
    config = run.read_config()
    sharded = config.train.sharded_checkpoints
    # no checkpoint to trust at all, or another config than it was trained with: say so before building anything
    # (the engine's Checkpointer asks the same rule, rundir's resume_checkpoint, for the one it loads)
    choice = resume_checkpoint(run, sharded=sharded)
    check_config_unchanged(run, config, choice, sharded=sharded, allow_change=allow_config_change)
    with leaving_the_job():
        build_trainer(config, run, callbacks, resuming=True).fit(resume=True)
    return run


def check_config_unchanged(run: RunDir, config: RunConfig, choice: CheckpointChoice, *, sharded: bool,
                           allow_change: bool) -> None:
    """Refuse (ConfigError) a config.yaml that differs from the one the checkpoint `choice` was trained with,
    but for the safe changes `allow_change` accepts: those are recorded as a `config_changed` event."""
    header = read_checkpoint_header(run, choice.path, sharded)
    main = launched_ranks().is_main
    if header["config"] is None:  # written before checkpoints recorded their config
        note = (f"{choice.path.name} does not record the config it was trained with (a checkpoint from an "
                "older trainwise): config.yaml is used as it is, unchecked.")
        if main:
            run.log_event("config_unchecked", note, step=header["step"])
            warnings.warn(note, RunDirWarning, stacklevel=3)
        return
    if header["config_hash"] == config_hash(config):
        return
    written = yaml.safe_load(run.read_config_text())  # read_config parsed it already: it is a mapping
    changes = check_resume_config(header["config"], config, allow_change=allow_change,
                                  checkpoint=choice.path.name, step=header["step"] or 0, written=written)
    if changes and main:
        message = "resumed with changed settings (--allow-config-change): " + "; ".join(map(str, changes))
        if any(c.path in ("train.max_steps", "train.epochs") for c in changes):
            message += (f". The LR schedule is re-fitted, not re-shaped: from step {header['step']} the LR goes on "
                        "from its value there and the rest of the decay ends at the new last step (no jump)")
        run.log_event("config_changed", message, severity="warning", step=header["step"],
                      evidence={"changes": [{"field": c.path, "old": c.old, "new": c.new} for c in changes],
                                "checkpoint_config_hash": header["config_hash"]})
        warnings.warn(message, RunDirWarning, stacklevel=3)
