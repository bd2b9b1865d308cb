"""`trainwise plan`: parse (a recipe, or a language model whose flags spell config keys) into one RunConfig,
call planner.make_plan, print the report (the card table here, a language model's in plan_llm.py) or JSON."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from trainwise.cli.plan_units import bytes_text, duration_text, flops_text, money_text


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
    app.command(name="plan")(plan)


def plan(
    recipe: Optional[str] = typer.Argument(None, help="A built-in recipe name (see `trainwise recipes`) or a YAML "
                                           "file; or a language model: a catalogue name (--list-models), a "
                                           "config.json or a Hugging Face model directory (no weights needed)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides, e.g. train.batch_size=256 "
                                                    "(for a language model too: model.lora.dropout=0)."),
    gpu: Optional[list[str]] = typer.Option(None, "--gpu", help="Only these cards (repeatable), e.g. --gpu A100-80GB."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="Most cards a multi-GPU option may use."),
    budget: Optional[float] = typer.Option(None, "--budget", help="Most the run may cost, in --currency."),
    deadline: Optional[float] = typer.Option(None, "--deadline", help="Hours the run may take."),
    prices: Optional[Path] = typer.Option(None, "--prices", help="A prices YAML that replaces or extends ours."),
    currency: str = typer.Option("USD", "--currency", help="Show costs in this currency (USD, CNY, ...)."),
    rate: Optional[list[str]] = typer.Option(None, "--rate", help="Exchange rate as CODE=USD_VALUE, "
                                             "e.g. --rate CNY=0.139 (repeatable)."),
    probe: bool = typer.Option(False, "--probe", help="Run a few real steps here and calibrate the estimate."),
    nproc: Optional[int] = typer.Option(None, "--nproc", min=1, help="Ranks (GPUs) per node: per-rank memory "
                                        "of DDP and FSDP on each card, and which strategy to use."),
    as_json: bool = typer.Option(False, "--json", help="Print everything as JSON."),
    method: Optional[str] = typer.Option(None, "--method", help="Language models: full, freeze, lora or qlora "
                                         "(model.method; a model named alone: full)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Language models: tokens per sequence "
                                          "(data.seq_len; a model named alone: 2048)."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Language models: sequences per optimizer step "
                                        "(train.batch_size; a model named alone: 16)."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Language models: sequences per "
                                              "forward/backward (train.micro_batch_size; a model named alone: "
                                              "the most that fits each card)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Language models: the weights' dtype, fp32 or bf16 "
                                        "(model.dtype; a model named alone: bf16 for a frozen base — lora, qlora, freeze — "
                                        "and fp32 master weights for full fine-tuning)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="Language models: autocast auto, bf16, "
                                            "fp16 or fp32 (train.precision; auto: bf16, fp16 where the card "
                                            "has no bf16)."),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="Language models: adamw, adamw8bit or sgd."),
    checkpointing: Optional[bool] = typer.Option(None, "--checkpointing/--no-checkpointing",
                                                 help="Language models: gradient checkpointing "
                                                 "(model.gradient_checkpointing)."),
    loss_chunk: Optional[int] = typer.Option(None, "--loss-chunk", help="Language models: cross-entropy this "
                                             "many tokens at a time (model.loss_chunk_size)."),
    lora_rank: Optional[int] = typer.Option(None, "--lora-rank", help="Language models: LoRA rank (lora, qlora; "
                                            "model.lora.rank, alpha 2 x rank)."),
    trainable_blocks: Optional[int] = typer.Option(None, "--trainable-blocks", help="Language models, freeze: "
                                                   "last blocks that train (model.trainable_blocks)."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Language models: optimizer steps of the "
                                        "run, to price the whole run."),
    tokens: Optional[float] = typer.Option(None, "--tokens", min=1, help="Language models: tokens the run trains "
                                           "on (e.g. 1e8), to price the whole run."),
    list_models: bool = typer.Option(False, "--list-models", help="List the catalogue of language models."),
) -> None:
    """Which GPU fits this training job, how long it takes and what it costs (no GPU needed)."""
    from trainwise.cli.plan_llm import list_catalogue, print_lm_report
    from trainwise.plan.catalog import parse_rates
    from trainwise.plan.planner import LmPlanReport, PlanRequest, make_plan

    if list_models:
        return list_catalogue()
    if recipe is None:
        raise typer.BadParameter("give a recipe (trainwise recipes), a YAML file or a language model "
                                 "(trainwise plan --list-models)", param_hint="RECIPE")
    flags = dict(method=method, seq_len=seq_len, batch_size=batch, micro_batch_size=micro_batch, dtype=dtype,
                 precision=precision, gradient_checkpointing=checkpointing, loss_chunk_size=loss_chunk,
                 lora_rank=lora_rank, trainable_blocks=trainable_blocks, optimizer=optimizer)
    config = plan_config(recipe, overrides or [], flags)
    request = PlanRequest(gpu_names=tuple(gpu or ()), max_gpus=gpus_per_node, budget=budget,
                          deadline_hours=deadline, prices_file=prices, currency=currency,
                          rates=parse_rates(rate or []), probe=probe, nproc=nproc, steps=steps,
                          tokens=int(tokens) if tokens else None, optimizer=optimizer)
    report = make_plan(config, request)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    elif isinstance(report, LmPlanReport):
        print_lm_report(report, Console())
    else:
        print_report(report, Console())


# `plan`'s flags are spellings of config keys: --method lora is model.method=lora (a dotted override says the same)
FLAG_KEYS = {"method": "model.method", "dtype": "model.dtype", "trainable_blocks": "model.trainable_blocks",
             "gradient_checkpointing": "model.gradient_checkpointing", "loss_chunk_size": "model.loss_chunk_size",
             "seq_len": "data.seq_len", "batch_size": "train.batch_size",
             "micro_batch_size": "train.micro_batch_size", "precision": "train.precision", "optimizer": "optim.name"}


def flag_overrides(flags: dict) -> list[str]:
    """The dotted overrides the flags given spell (a flag left out sets nothing). --lora-rank R is
    model.lora.rank=R with alpha 2 x R, the usual scale; a plan-only optimizer (adamw8bit) is the planner's."""
    from trainwise.plan.llm_job import PLAN_ONLY_OPTIMIZERS

    out = [f"{FLAG_KEYS[name]}={json.dumps(value)}" for name, value in flags.items()
           if name in FLAG_KEYS and value is not None
           and not (name == "optimizer" and value in PLAN_ONLY_OPTIMIZERS)]
    if flags.get("lora_rank") is not None:
        out += [f"model.lora.rank={flags['lora_rank']}", f"model.lora.alpha={2.0 * flags['lora_rank']}"]
    return out


def plan_config(argument: str, overrides: list[str], flags: dict):
    """The RunConfig `trainwise plan ARGUMENT [overrides] [flags]` describes: a language model named by a
    catalogue name, a config.json or a model directory is model.hf_config=ARGUMENT (llm_job.model_config);
    anything else is a recipe. The flags come before the overrides, so a dotted key written out wins."""
    from trainwise.plan.llm_job import model_config

    spelled = flag_overrides(flags) + list(overrides)
    if is_language_model_argument(argument):
        return model_config(argument, spelled)
    return load_recipe_or_model(argument, spelled)


def is_language_model_argument(argument: str) -> bool:
    """A catalogue name, a .json file (even a missing one: the error then says so), or a model directory;
    never a recipe (YAML or built-in name)."""
    from trainwise.llm.hf import looks_like_config_spec
    suffix = Path(argument).suffix
    if suffix in (".yaml", ".yml"):
        return False
    return suffix == ".json" or looks_like_config_spec(argument)


def load_recipe_or_model(name: str, overrides: list[str]):
    """The recipe `name` names; a name that is neither a recipe nor a model says where both are listed."""
    from trainwise.errors import ConfigError
    from trainwise.recipes import load_recipe
    try:
        return load_recipe(name, overrides)
    except ConfigError as error:
        if str(error).startswith("unknown recipe"):
            raise ConfigError(f"{error} A language model to plan is a catalogue name (trainwise plan "
                              "--list-models), a config.json or a model directory.") from None
        raise


def print_report(report, console: Console) -> None:
    data = report.to_dict()
    job, advice = data["job"], report.advice
    cuda = data["memory"]["cuda"]
    total, trainable = job.get("total_parameters") or job["parameters"], job["parameters"]
    counts = f"[bold]{total:,}[/] parameters" + (f" ({trainable:,} trainable)" if trainable != total else "")
    console.print(f"{counts}, batch {job['batch_size']} "
                  f"(micro-batch {job['micro_batch_size']} × {job['accumulation_steps']}{_per_rank(job)}), "
                  f"{job['total_steps']:,} steps ({job['steps_per_epoch']} per epoch), {job['precision_planned']}, "
                  f"{job['optimizer']}; {flops_text(data['flops_per_optimizer_step'])} per step.")
    parts = ", ".join(f"{name.replace('_', ' ')} {bytes_text(value)}"
                      for name, value in cuda["breakdown_bytes"].items())
    console.print(f"Peak of one training step on a GPU (traced, micro-batch {cuda['micro_batch_size']}): "
                  f"[bold]{bytes_text(cuda['peak_bytes'])}[/] = {parts}; "
                  f"+{bytes_text(cuda['per_sample_bytes'])} per extra sample; plus CUDA context and "
                  "library workspaces per card.")
    _print_cards(advice, console)
    cpu = next(r for r in advice.rows if r.kind == "cpu")
    console.print(f"[dim]this machine: {report.machine['cpu_model']}, {report.machine['torch_threads']} torch "
                  f"threads, {bytes_text(report.machine['ram_available_bytes'])} RAM available; "
                  f"{duration_text(cpu.step_time_s / 3600)} per step"
                  f"{' measured' if cpu.measured else ' estimated (--probe measures it)'}.[/]")
    for title, row in (("Cheapest", _cheapest_shown(advice)), ("Fastest", advice.fastest)):
        if row:
            console.print(f"{title}: [bold]{row.cards}× {row.name}[/] ({row.offer['provider']} "
                          f"{row.offer['instance']}, {row.offer['region']}): {duration_text(row.offer['hours'])}, "
                          f"{money_text(row.cost_on_demand)} {advice.currency} on demand.")
    _print_strategies(report.strategies, console)
    for message in advice.messages + data["notes"]:
        console.print(message)
    console.print(f"Host RAM needed: {bytes_text(advice.host_ram_bytes)}; disk for data and checkpoints: "
                  f"{bytes_text(advice.disk_bytes)}.")
    console.print(f"[dim]Prices are defaults to check (as of {data['prices']['as_of']}): verify them on each "
                  "provider's page, or pass your own with --prices FILE.[/]")


def _print_cards(advice, console: Console) -> None:
    """One row per option. The full table when the terminal holds it; otherwise the columns that decide
    (fits, memory, time, cost) and each option's detail on a line of its own below, so that nothing wraps
    into three lines or loses the end of an instance name."""
    cells = [_cells(row, advice.currency) for row in advice.rows + advice.multi_gpu]
    wide = Table("card", "fits", "needs / has", "micro × accum", "per epoch", "total",
                 f"{advice.currency} on-demand / spot / month", "cheapest offer", box=None)
    for c in cells:
        wide.add_row(c["name"], c["fits"], c["memory"], c["batch"], c["epoch"], c["total"], c["costs"], c["offer"])
    if Measurement.get(console, console.options.update_width(10_000), wide).maximum <= console.width:
        console.print(wide)
        return
    narrow = Table("card", "fits", "needs / has", "total", f"{advice.currency} on-demand", box=None)
    for c in cells:
        narrow.add_row(c["name"], c["fits"], c["memory"], c["total"], c["on_demand"])
    for column in narrow.columns:
        column.no_wrap = True
    console.print(narrow)
    console.print(f"[dim]cheapest offer; micro-batch × accumulation, time per epoch, {advice.currency} spot "
                  "and monthly cost (a wider terminal shows them in the table):[/]")
    for c in cells:
        console.print(f"  {c['name']}: {c['offer']}; {c['batch']}, {c['epoch']} per epoch, {c['spot_month']}",
                      highlight=False)


def _cells(row, currency: str) -> dict[str, str]:
    name = row.name if row.cards == 1 else f"{row.cards}× {row.name} {row.strategy.upper()}"
    if row.kind == "cpu":
        name = "[bold]this machine (CPU)[/]"
    elif row.note == "this machine":
        name = f"[bold]{name} (this machine)[/]"
    offer, where = row.offer, "—"
    if offer:
        where = f"{offer['provider']} {offer['instance']}"
        if offer["gpus"] != row.cards:
            where += f" ({offer['gpus']} GPUs: {duration_text(offer['hours'])})"
    return {
        "name": name, "fits": "[green]yes[/]" if row.fits else "[red]no[/]",
        "memory": f"{bytes_text(row.needed_bytes)} / {bytes_text(row.memory_bytes)}",
        "batch": f"{row.micro_batch_size} × {row.accumulation_steps}" if row.fits else f"max {row.max_micro_batch}",
        "epoch": duration_text(row.epoch_hours) if row.fits else "—",
        "total": (duration_text(row.total_hours) + (" (measured)" if row.measured else "")) if row.fits else "—",
        "costs": " / ".join(money_text(v) for v in (row.cost_on_demand, row.cost_spot, row.cost_monthly)),
        "on_demand": money_text(row.cost_on_demand),
        "spot_month": f"spot {money_text(row.cost_spot)}, month {money_text(row.cost_monthly)}",
        "offer": where,
    }


def _cheapest_shown(advice):
    """The cheapest option, named only when it is cheaper as shown than another priced option: with one
    priced option, or all costing the same to the shown digit, none is "cheapest"."""
    row = advice.cheapest
    shown = {money_text(r.cost_on_demand) for r in advice.rows + advice.multi_gpu
             if r.fits and r.cost_on_demand is not None}
    return row if row is not None and len(shown) > 1 else None


def _per_rank(job: dict) -> str:
    return f" on each of {job['ranks']} ranks" if job.get("ranks", 1) > 1 else ""


def _print_strategies(plans, console: Console) -> None:
    """Per-rank memory of each strategy at --nproc ranks, and the one `train.strategy: auto` picks."""
    if not plans:
        return
    console.print(f"With {plans[0].ranks} ranks per node (per-rank memory, micro-batch):")
    for plan in plans:
        cells = "; ".join(f"{strategy.upper()} {bytes_text(row.needed_bytes)}"
                          f"{f' (micro-batch {row.micro_batch_size})' if row.fits else ' does not fit'}"
                          for strategy, row in plan.rows.items())
        pick = f"[bold]{plan.recommended}[/]" if plan.recommended else "[red]neither[/]"
        console.print(f"  {plan.card}: {cells} → {pick}: {plan.reason}")
