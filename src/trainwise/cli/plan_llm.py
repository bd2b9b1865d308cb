"""`trainwise plan` for language models: detect a model argument, build the job from the flags (or a recipe's
model.hf / model.hf_config), call plan.llm_report, print the report in the user's words."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

GiB = 2**30


def is_language_model(argument: str) -> bool:
    """A catalogue name, a .json file (even a missing one: the error then says so), or a model directory;
    never a recipe (YAML or built-in name)."""
    from trainwise.llm.hf import looks_like_config_spec
    suffix = Path(argument).suffix
    if suffix in (".yaml", ".yml"):
        return False
    return suffix == ".json" or looks_like_config_spec(argument)


def language_model_plan(argument: str, flags: dict, gpus: tuple[str, ...], max_gpus: int, as_json: bool,
                        overrides: list[str] = ()) -> bool:
    """Plan `argument` as a language model when it names one (True), else leave it to the recipe path."""
    if not is_language_model(argument):
        return False
    if overrides:
        from trainwise.errors import ConfigError
        raise ConfigError(f"{' '.join(overrides)}: KEY=VALUE overrides change a recipe, and {argument} is a model. "
                          "Use the flags (--method, --seq-len, --batch, --micro-batch, --dtype, --lora-rank, ...; "
                          "see trainwise plan --help), or plan a recipe whose model.hf_config names this model: "
                          "trainwise plan recipe.yaml model.lora.dropout=0")
    from trainwise.llm.methods import LoraSettings
    from trainwise.plan.llm_report import make_lm_plan
    from trainwise.plan.llm_step import LmJob
    flags = dict(flags)
    rank = flags.pop("lora_rank")
    lora = LoraSettings(rank=rank, alpha=2.0 * rank)  # alpha = 2 x rank, the usual scale
    job = LmJob(model=argument, lora=lora, **flags)
    _show(make_lm_plan(job, gpus, max_gpus), as_json)
    return True


def lm_recipe_plan(config, gpus: tuple[str, ...], max_gpus: int, as_json: bool) -> bool:
    """Plan a recipe whose model is a language model (model.hf or model.hf_config) (True), else False."""
    if not (config.model.hf or config.model.hf_config):
        return False
    from trainwise.plan.llm_report import lm_job_from_config, make_lm_plan
    job, notes = lm_job_from_config(config)
    _show(make_lm_plan(job, gpus, max_gpus, notes=notes), as_json)
    return True


def list_catalogue() -> None:
    from trainwise.llm import catalogue
    for name in catalogue.names():
        entry = catalogue.lookup(name)
        typer.echo(f"{name:<16} {entry.parameters / 1e9:>7.2f} B  {entry.config['model_type']:<8} {entry.source}")


def _show(report, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print_lm_report(report, Console())


def _bytes(n: float) -> str:
    from trainwise.cli.plan import _bytes as fmt
    return fmt(n)


def print_lm_report(report, console: Console) -> None:
    data, job = report.to_dict(), report.estimate.job
    params, peak = data["parameters"], data["peak"]
    share = params["trainable"] / max(params["total"], 1)
    method = {"full": "full fine-tuning", "freeze": f"last {job.trainable_blocks} blocks + head",
              "lora": f"LoRA rank {job.lora.rank}", "qlora": f"QLoRA rank {job.lora.rank} (4-bit base)"}[job.method]
    extras = [x for x in ("gradient checkpointing" if job.gradient_checkpointing else "",
                          f"loss in chunks of {job.loss_chunk_size}" if job.loss_chunk_size else "") if x]
    console.print(f"[bold]{job.model}[/]: [bold]{params['total']:,}[/] parameters, [bold]{params['trainable']:,}[/] "
                  f"trainable ({share:.2%}); {method}, {job.dtype} weights, {job.precision} autocast, "
                  f"{job.optimizer}{''.join(', ' + x for x in extras)}; batch {job.batch_size} × {job.seq_len:,} "
                  f"tokens (micro-batch {job.micro} × {job.batch_size // job.micro}).", highlight=False)
    parts = ", ".join(f"{name.replace('_', ' ')} {_bytes(value)}"
                      for name, value in sorted(peak["breakdown_bytes"].items(), key=lambda kv: -kv[1]) if value)
    console.print(f"Peak of one training step (traced, micro-batch {peak['micro_batch_size']}): "
                  f"[bold]{_bytes(peak['bytes'])}[/], in the {peak['where'] or 'step'} = {parts}.", highlight=False)
    console.print(f"Each extra token of context: +{_bytes(data['per_extra_token_bytes'])} at micro-batch {job.micro} "
                  f"(traced at {job.seq_len:,} and {2 * job.seq_len:,} tokens); each extra sequence per micro-batch: "
                  f"+{_bytes(data['per_extra_sequence_bytes'])}.", highlight=False)
    _print_layouts(report, console)
    ram = data["host_ram_bytes"]
    console.print(f"Host RAM: {_bytes(sum(ram.values()))} (" + "; ".join(f"{k} {_bytes(v)}" for k, v in ram.items())
                  + f"); with CPU offload another {_bytes(data['offload_host_ram_bytes'])}.", highlight=False)
    _print_levers(report, console)
    for note in data["notes"]:
        console.print(note, highlight=False)
    console.print(f"[dim]Planned in {report.seconds:.0f} s on fake tensors (no weights, no GPU).[/]")


def _print_layouts(report, console: Console) -> None:
    console.print("Per card (CUDA context, workspaces and a 10% margin included):")
    by_card: dict[str, list] = {}
    for layout in report.advice.layouts:
        by_card.setdefault(layout.card, []).append(layout)
    for card, rows in by_card.items():
        cells = []
        for row in rows:
            name = "1 card" if row.cards == 1 else (f"FSDP ×{row.cards}" + (" + CPU offload"
                                                                            if "offload" in row.strategy else ""))
            verdict = (f"[green]fits[/], micro-batch {row.micro_batch_size}, {row.step_time_s:.2f} s/step"
                       if row.fits else "[red]no[/]")
            cells.append(f"{name}: {verdict} ({_bytes(row.needed_bytes)} per card)")
        console.print(f"  {card} ({_bytes(rows[0].memory_bytes)}): " + "; ".join(cells), highlight=False)


def _print_levers(report, console: Console) -> None:
    advice = report.advice
    if not advice.levers:
        return
    console.print("What would make it fit, least slowdown first (each re-traced at micro-batch 1):")
    for index, lever in enumerate(advice.levers, 1):
        where = f"fits {', '.join(lever.fits)}" if lever.fits else "fits none of these cards alone"
        note = " — changes the job" if lever.changes_job else ""
        console.print(f"  {index}. {lever.name} ({lever.how}): peak {_bytes(lever.peak_bytes)}, step time "
                      f"×{lever.slowdown:.2f}; {where}{note}", highlight=False)
    if advice.combined:
        console.print(f"  Together: {advice.combined.name} ({advice.combined.how}): peak "
                      f"{_bytes(advice.combined.peak_bytes)}, fits {', '.join(advice.combined.fits)}.",
                      highlight=False)
