"""`trainwise plan`'s printer for a language model's plan (planner.LmPlanReport): the job, its peak, its layouts
per card and the levers that make it fit, in the user's words; and the model catalogue (--list-models)."""
from __future__ import annotations

import typer
from rich.console import Console

from trainwise.cli.plan_units import bytes_text, duration_text, flops_text, money_text

GiB = 2**30


def list_catalogue() -> None:
    from trainwise.llm import catalogue
    typer.echo(f"{'name':<16} {'parameters':>12}  {'family':<8} published as")
    for name in catalogue.names():
        entry = catalogue.lookup(name)
        typer.echo(f"{name:<16} {entry.parameters / 1e9:>10.2f} B  {entry.config['model_type']:<8} {entry.source}")
    typer.echo("Plan one with: trainwise plan NAME --method lora --gpu RTX4090 (a config.json or a model directory "
               "works too).")


def print_lm_report(report, console: Console) -> None:
    data, job = report.to_dict(), report.estimate.job
    params, peak = data["parameters"], data["peak"]
    fp16 = {row.precision for row in report.advice.layouts} == {"fp16"}
    console.print(f"[bold]{job.model}[/]: {_headline(job, fp16)}.", highlight=False)
    share = params["trainable"] / max(params["total"], 1)
    extras = [x for x in ("gradient checkpointing" if job.gradient_checkpointing else "",
                          f"loss in chunks of {job.loss_chunk_size}" if job.loss_chunk_size else "") if x]
    console.print(f"[bold]{params['total']:,}[/] parameters, [bold]{params['trainable']:,}[/] trainable "
                  f"({share:.2%}); {job.optimizer}{''.join(', ' + x for x in extras)}; batch {job.batch_size} × "
                  f"{job.seq_len:,} tokens; {flops_text(data['flops_per_step'])} per optimizer step.", highlight=False)
    parts = ", ".join(f"{name.replace('_', ' ')} {bytes_text(value)}"
                      for name, value in sorted(peak["breakdown_bytes"].items(), key=lambda kv: -kv[1]) if value)
    console.print(f"Peak of one training step (traced, micro-batch {peak['micro_batch_size']}): "
                  f"[bold]{bytes_text(peak['bytes'])}[/], in the {peak['where'] or 'step'} = {parts}.",
                  highlight=False)
    console.print(f"Each extra token of context: +{bytes_text(data['per_extra_token_bytes'])} at micro-batch "
                  f"{job.micro} (traced at {job.seq_len:,} and {2 * job.seq_len:,} tokens); each extra sequence per "
                  "micro-batch: "
                  f"+{bytes_text(data['per_extra_sequence_bytes'])}.", highlight=False)
    _print_layouts(report, console)
    ram = data["host_ram_bytes"]
    console.print(f"Host RAM: {bytes_text(sum(ram.values()))} ("
                  + "; ".join(f"{k} {bytes_text(v)}" for k, v in ram.items())
                  + f"); with CPU offload another {bytes_text(data['offload_host_ram_bytes'])}.", highlight=False)
    _print_levers(report, console)
    for note in data["notes"]:
        console.print(note, highlight=False)
    if data["prices_as_of"]:
        console.print(f"[dim]Prices: the cheapest on-demand offer of plan/prices.yaml (as of {data['prices_as_of']}) "
                      "holding the layout's cards; check them on each provider's page or pass --prices FILE.[/]")
    console.print(f"[dim]Planned in {report.seconds:.0f} s on fake tensors (no weights, no GPU).[/]")


def _headline(job, fp16: bool = False) -> str:
    """The first line: what trains, in which dtype, under which autocast — the decision a reader checks first."""
    method = {"full": "full fine-tuning", "freeze": f"the last {job.trainable_blocks} blocks + head train",
              "lora": f"LoRA rank {job.lora.rank}", "qlora": f"QLoRA rank {job.lora.rank}"}[job.method]
    if job.method == "qlora":
        weights = "a 4-bit (NF4) frozen base"
    elif job.method == "full":
        weights = ("fp32 master weights (mixed precision)" if job.dtype == "fp32"
                   else "pure bf16 weights (no fp32 master copy)")
    else:
        weights = f"a {job.dtype} frozen base" + (" (fp32 weights: --dtype bf16 halves them)"
                                                   if job.dtype == "fp32" else "")
    autocast = {"bf16": "fp16 autocast with loss scaling (the cards have no bf16)" if fp16 else "bf16 autocast", "fp16": "fp16 autocast with loss scaling",
                "fp32": "no autocast (fp32)"}.get(job.precision, f"{job.precision} autocast")
    return f"{method} on {weights}, {autocast}"


def _print_layouts(report, console: Console) -> None:
    data = report.to_dict()
    currency, steps = data["currency"], data["steps"]
    run = f", the run's {steps:,} steps" if steps else ""
    console.print(f"Per card (needs / usable: CUDA context, workspaces and a 10% margin counted); step time at "
                  f"{MFU_TEXT}; {currency} per hour{run}:")
    by_card: dict[str, list] = {}
    for layout in report.advice.layouts:
        by_card.setdefault(layout.card, []).append(layout)
    for card, rows in by_card.items():
        fp16 = " (fp16 autocast + loss scaling: no bf16)" if rows[0].precision == "fp16" else ""
        console.print(f"  {card} ({bytes_text(rows[0].memory_bytes)}){fp16}:", highlight=False)
        for row in rows:
            console.print(f"    {_layout_line(row)}", highlight=False)


MFU_TEXT = "40% of the card's peak FLOP/s (model FLOPs utilisation, PaLM paper Table 3)"


def _layout_line(row) -> str:
    name = "1 card" if row.cards == 1 else (f"FSDP ×{row.cards}" + (" + CPU offload"
                                                                    if "offload" in row.strategy else ""))
    memory = f"needs {bytes_text(row.needed_bytes)} of {bytes_text(row.usable_bytes)} usable"
    if not row.fits:
        short = row.needed_bytes - row.usable_bytes
        return f"{name}: [red]no[/] — {memory} per card, {bytes_text(short)} short"
    cost = ""
    if row.price_per_hour is not None:
        cost = f"; {money_text(row.price_per_hour)}/h ({money_text(row.price_per_card_hour)} per card, {row.offer})"
        if row.run_cost is not None:
            cost += f"; the run: {duration_text(row.run_hours)}, {money_text(row.run_cost)}"
    elif row.run_hours is not None:
        cost = f"; the run: {duration_text(row.run_hours)} (no price listed)"
    return (f"{name}: [green]fits[/], micro-batch {row.micro_batch_size}, {row.step_time_s:.2f} s/step "
            f"({row.tokens_per_s:,.0f} tokens/s, {row.bound}-bound); {memory} per card{cost}")


def _print_levers(report, console: Console) -> None:
    advice = report.advice
    if not advice.levers:
        return
    console.print("What would make it fit (each re-traced at micro-batch 1; step time relative to this job on "
                  "one of the smallest cards asked about, as if it fitted):")
    for index, lever in enumerate(advice.levers, 1):
        where = f"fits {', '.join(lever.fits)}" if lever.fits else "fits none of these cards alone"
        note = " — changes the job" if lever.changes_job else ""
        console.print(f"  {index}. {lever.name} ({lever.how}): peak {bytes_text(lever.peak_bytes)}"
                      f"{' per card' if lever.name.startswith('FSDP') else ''}, step time ×{lever.slowdown:.2f}; "
                      f"{where}{note}", highlight=False)
    if advice.combined:
        console.print(f"  Together: {advice.combined.name} ({advice.combined.how}): peak "
                      f"{bytes_text(advice.combined.peak_bytes)}, step time ×{advice.combined.slowdown:.2f}, fits "
                      f"{', '.join(advice.combined.fits)}.", highlight=False)
