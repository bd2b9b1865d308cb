"""CLI commands of this room: `trainwise prepare`, `trainwise data verify`, `trainwise data bench`."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainwise.errors import DataError

console = Console()
data_app = typer.Typer(name="data", help="Check and measure prepared datasets.", no_args_is_help=True)


def prepare(
    source: Path = typer.Argument(..., help="A folder of class sub-folders of images, a CSV/Parquet table, an "
                                  "interaction log (CSV/Parquet with user, item, timestamp; MovieLens "
                                  "ratings.dat or u.data; RecBole .inter), text (.txt/.md files or folders; "
                                  "JSONL, JSON or Parquet rows with a text field), or instruction data (JSONL, "
                                  "JSON or Parquet rows: alpaca, sharegpt, messages, prompt-completion)."),
    to: Path = typer.Option(..., "--to", help="Directory to write the prepared dataset to (keep it off the "
                            "system disk)."),
    kind: str = typer.Option("auto", help="auto | images | table | interactions | text."),
    workers: Optional[int] = typer.Option(None, help="Processes decoding images (default: all cores)."),
    size: str = typer.Option("64", help="Images: output size, `64` or `HEIGHTxWIDTH`; resized to cover, then "
                             "center-cropped."),
    channels: int = typer.Option(3, help="Images: 3 (RGB) or 1 (grayscale)."),
    label: Optional[str] = typer.Option(None, help="Tables: the label column (default: label/target/y/class)."),
    task: str = typer.Option("auto", help="Tables: auto | classification | regression."),
    val_fraction: float = typer.Option(0.1, help="Share held out for validation."),
    test_fraction: Optional[float] = typer.Option(None, help="Share held out for the final test (default: 0.1, "
                                                  "or none beside --test-file)."),
    test_file: Optional[Path] = typer.Option(None, "--test-file", help="Text and instruction data: a file (or "
                                             "folder) of held-out rows or documents, in the source's format, that "
                                             "is the test split instead of a random share (add --test-fraction to "
                                             "hold out some of the source too). Read and checked as the source is: "
                                             "bad rows are named by file:line."),
    seed: int = typer.Option(0, help="Seed of the (stratified) split."),
    shard_size: Optional[int] = typer.Option(None, help="Samples per shard (default: ~32 MiB shards)."),
    split: str = typer.Option("time", help="Interactions: `time` (one global cut-off) or `last-k` (each "
                              "user's last k events are test, the k before validation)."),
    last_k: int = typer.Option(1, help="Interactions with --split last-k: events per user held out per split."),
    user_col: Optional[str] = typer.Option(None, help="Interactions: user column."),
    item_col: Optional[str] = typer.Option(None, help="Interactions: item column."),
    time_col: Optional[str] = typer.Option(None, help="Interactions: timestamp column."),
    target_col: Optional[str] = typer.Option(None, help="Interactions: rating/target column (default: rating)."),
    event_col: Optional[str] = typer.Option(None, help="Interactions: behaviour type column (view/cart/buy; "
                                            "default: one named event), kept as a feature recommenders read."),
    session_gap: Optional[str] = typer.Option(None, help="Interactions: a pause longer than this (e.g. 30m, "
                                              "2h) starts a new session; each event keeps its session id."),
    keep_duplicates: bool = typer.Option(False, help="Interactions: keep events that repeat an earlier row "
                                         "exactly (by default they are dropped and counted)."),
    encoding: Optional[str] = typer.Option(None, help="Tables and logs: the text encoding when it is not UTF-8, "
                                           "e.g. latin-1 or cp1252."),
    numeric: Optional[str] = typer.Option(None, help="Tables: columns to read as numbers, comma-separated; their "
                                          "text cells count as missing."),
    categorical: Optional[str] = typer.Option(None, help="Tables: columns to read as categories (one-hot), "
                                              "comma-separated, even when they hold numbers."),
    max_image_pixels: Optional[int] = typer.Option(None, help="Images: read images up to this many pixels "
                                                   "(default: Pillow's decompression-bomb limit, about 89 million)."),
    tokenizer: Optional[str] = typer.Option(None, help="Text: `bytes` (default: 256 byte ids, nothing to "
                                            "download) or a local model directory whose tokenizer to use."),
    train_tokenizer: Optional[int] = typer.Option(None, help="Text: train a byte-level BPE of this many ids on "
                                                  "the training documents (e.g. 8000)."),
    text_field: str = typer.Option("text", help="Text: the field of each JSONL/JSON/Parquet row that holds the "
                                  "document."),
    seq_len: Optional[int] = typer.Option(None, help="Text: the context length to report truncation and packing "
                                          "for (default: suggested from the document lengths)."),
    chat_format: str = typer.Option("auto", "--format", help="Chat data: alpaca | sharegpt | messages | "
                                     "prompt-completion | auto (detected from the rows)."),
    template: Optional[str] = typer.Option(None, help="Chat data: chatml | llama3 | plain (default: the tokenizer's)."),
    too_long: str = typer.Option("truncate", help="Chat data over --seq-len: truncate the prompt, or drop."),
    mask_prompt: bool = typer.Option(True, "--mask-prompt/--no-mask-prompt", help="Chat data: loss on answers only."),
    force: bool = typer.Option(False, help="Prepare again even when DIR is up to date, and start an interrupted "
                               "prepare over instead of resuming it."),
) -> None:
    """Turn raw images, a table, an interaction log or text into checksummed, memory-mappable shards. The new
    dataset is built beside DIR and swapped in when complete: DIR stays usable until then."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from trainwise.data.prepare import PrepareOptions, prepare as run_prepare

    chosen = dict(locals())
    chosen["test_file"] = str(test_file) if test_file is not None else None
    if test_fraction is None:  # a held-out file is the test split; a random share only when asked for too
        chosen["test_fraction"] = 0.0 if test_file is not None else 0.1
    options = PrepareOptions(**{field.name: chosen[field.name] for field in dataclasses.fields(PrepareOptions)})
    try:
        with Progress("shards", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                      transient=True) as bar:
            task_id = bar.add_task("prepare", total=None)
            result = run_prepare(source, to, options, workers=workers, force=force,
                                 progress=lambda done, total: bar.update(task_id, completed=done, total=total))
    except KeyboardInterrupt:
        console.print(f"interrupted: {to} is as it was before this prepare (the new dataset is swapped in only "
                      "when complete). Run the same command again to resume: finished shards are kept beside it "
                      "(text is tokenised again). Add --force to start over.", soft_wrap=True, highlight=False,
                      markup=False)
        raise typer.Exit(130) from None
    _print_result(result, to, tokenizer)


def _print_result(result, to: Path, tokenizer: str | None = None) -> None:
    """What prepare did, how it read the source, what it warns of, and the command that trains on it (with the
    model whose tokenizer `--tokenizer` named)."""
    for note in result.notes:
        console.print(note, highlight=False, markup=False, soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    manifest = result.manifest
    if result.status == "up-to-date":
        console.print(f"{to}: up to date (same source and options); nothing to do. Use --force to redo it.",
                      soft_wrap=True)
        _print_next_step(manifest, to, tokenizer)
        return
    counts = ", ".join(f"{split} {info['count']:,}" for split, info in manifest["splits"].items())
    resumed = f"; resumed, {result.reused_shards} shards kept from the interrupted run" if result.reused_shards else ""
    console.print(f"prepared {manifest['kind']} into {to}: {counts}{resumed}", soft_wrap=True)
    if manifest["kind"] == "text":
        from trainwise.data.text.prepare import summary_lines

        lines = summary_lines(manifest)
        if "instruct" in manifest:
            from trainwise.data.text.chat_prepare import summary_lines as instruct_lines

            lines += instruct_lines(manifest)
        for line in lines:
            console.print(line, soft_wrap=True, highlight=False, markup=False)
    skipped = manifest.get("skipped") or {}
    if skipped.get("count") and manifest["kind"] != "text":
        names = ([f"{s['file']} ({s['reason']})" for s in skipped.get("files", [])][:5]
                 or [f"row {r}" for r in skipped.get("rows", [])][:5])
        listed = f": {', '.join(names)}{' ...' if skipped['count'] > len(names) else ''}" if names else ""
        why = f" ({skipped['reason']})" if skipped.get("reason") else ""
        console.print(f"[yellow]skipped {skipped['count']}[/]{escape(why + listed)} (all listed in manifest.json)",
                      highlight=False, soft_wrap=True)
    _print_next_step(manifest, to, tokenizer)


MIN_STEPS_PER_EPOCH = 4  # a suggested batch size leaves at least this many optimizer steps per epoch


def next_step(manifest: dict, to: Path, tokenizer: str | None = None) -> str:
    """The `trainwise train` command that trains on the prepared data, with a batch size the training split
    can fill (the recipe's default when it fits), and the model directory `--tokenizer` named."""
    import shlex

    from trainwise.recipes import load_recipe

    model = shlex.quote(tokenizer) if tokenizer and Path(tokenizer).expanduser().is_dir() else None

    if manifest["kind"] == "text" and "instruct" in manifest:
        return (f"Next: trainwise train sft-lora model.hf={model or 'MODEL_DIR'} "
                f"data.path={shlex.quote(str(to))} --out "
                f"runs/{shlex.quote(Path(to).name)} (LoRA on a local Hugging Face model; model.method=full or freeze "
                "for the others)")
    if manifest["kind"] == "text" and model:
        return (f"Next: trainwise train lm-gpt model.hf={model} data.path={shlex.quote(str(to))} --out "
                f"runs/{shlex.quote(Path(to).name)} (the model whose tokenizer made the data)")
    if manifest["kind"] == "text":
        return (f"Next: trainwise train lm-gpt data.path={shlex.quote(str(to))} --out runs/{shlex.quote(Path(to).name)}"
                f" (a small GPT; model.hf_config=gpt2 or model.hf=DIR for a Hugging Face model)")
    if manifest["kind"] == "interactions":
        return (f"Next: trainwise train shop-sasrec --out runs/sasrec data.path={shlex.quote(str(to))} "
                "(or shop-din), then trainwise eval runs/sasrec --json.")
    recipe = "image-folder" if manifest["kind"] == "images" else "table"
    path = shlex.quote(str(to))
    default = load_recipe(recipe, [f"data.path={to}"]).train.batch_size
    train_count = manifest["splits"]["train"]["count"]
    batch = default
    while batch > 1 and train_count < MIN_STEPS_PER_EPOCH * batch:
        batch //= 2
    extra = f" train.batch_size={batch}" if batch != default else ""
    if manifest.get("task") == "regression" and recipe == "table":
        extra += " eval.monitor=val/mae"
    why = (f" (the recipe's batch of {default} gives {train_count // default} steps per epoch on "
           f"{train_count:,} training samples; {batch} gives {train_count // batch})" if batch != default else "")
    return (f"Next: trainwise train {recipe} data.path={path} --out runs/{shlex.quote(Path(to).name)}{extra}"
            f"{why}")


def _print_next_step(manifest: dict, to: Path, tokenizer: str | None = None) -> None:
    console.print(next_step(manifest, to, tokenizer), soft_wrap=True, highlight=False)


@data_app.command("verify")
def verify(
    directory: Path = typer.Argument(..., help="A prepared dataset directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON (damaged shards still exit 2)."),
) -> None:
    """Check manifest.json (schema, checksum), then every shard against it: header, size and sha256."""
    import json

    from trainwise.data.shards import (CHECKSUM, UncheckedManifestWarning, iter_files, read_manifest,
                                       verify as verify_shards)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UncheckedManifestWarning)
        manifest = read_manifest(directory)  # a damaged manifest is a DataError naming the field: exit 2
    if not as_json:
        for warning in caught:
            console.print(f"[yellow]warning:[/] {warning.message}", highlight=False, soft_wrap=True)
    problems = verify_shards(directory, manifest)
    files = sum(1 for _ in iter_files(manifest))
    if as_json:
        typer.echo(json.dumps({"directory": str(directory), "ok": not problems, "files": files,
                               "manifest_checksum": CHECKSUM in manifest,
                               "warnings": [str(w.message) for w in caught],
                               "damaged": [{"file": str(p.file), "problem": p.problem} for p in problems]}))
    if problems:
        lines = "\n".join(f"  {p.file}: {p.problem}" for p in problems)
        raise DataError(f"{directory}: {len(problems)} of {files} shard files are damaged:\n{lines}\n"
                        f"Prepare the dataset again (`trainwise prepare SOURCE --to {directory} --force`).")
    if as_json:
        return
    checked = "manifest.json matches its checksum; " if CHECKSUM in manifest else ""
    console.print(f"{directory}: {checked}all {files} shard files match their sha256.",
                  soft_wrap=True)


@data_app.command("bench")
def bench(
    directory: Path = typer.Argument(..., help="A prepared dataset directory."),
    recipe: Optional[str] = typer.Option(None, help="Recipe whose model sets the pace (default: image-folder "
                                         "for images, table for tables)."),
    workers: Optional[str] = typer.Option(None, help="data.num_workers values to try, e.g. auto,0,2,4 (default: auto "
                                          "and 0 up to the cores)."),
    batch_size: Optional[int] = typer.Option(None, help="Batch size (default: the recipe's)."),
    quick: bool = typer.Option(True, "--quick/--full", help="--quick (default, a few seconds): auto, 0 and the "
                               "most workers for 0.5 s each, and 2 model steps; --full: every worker count for 2 s "
                               "each, and 10 model steps."),
    seconds: Optional[float] = typer.Option(None, help="Seconds of loading per worker count (default: 0.5 with "
                                            "--quick, 2 with --full)."),
    device: Optional[str] = typer.Option(None, help="Device of the model probe (default: the recipe's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the measurements and the verdict as JSON."),
) -> None:
    """Loader samples/s by worker count against the model's consumption: will data be the bottleneck?"""
    import json

    from trainwise.data.bench import FULL_SECONDS, QUICK_SECONDS, worker_counts
    from trainwise.check.throughput import bench_prepared

    counts = _parse_workers(workers) if workers else worker_counts(quick=quick)
    if seconds is not None and seconds <= 0:
        raise DataError(f"--seconds {seconds:g}: give a positive number of seconds, e.g. --seconds 1.")
    result = bench_prepared(directory, recipe=recipe, workers=counts, batch_size=batch_size,
                            seconds=seconds or (QUICK_SECONDS if quick else FULL_SECONDS), device=device,
                            quick=quick)
    if as_json:
        typer.echo(json.dumps({"loader_samples_per_s": result.loader, "model_samples_per_s": result.model,
                               "batch_size": result.batch_size, "device": result.device, "recipe": result.recipe,
                               "recommended_num_workers": result.verdict.workers,
                               "bottleneck": result.verdict.bottleneck, "message": result.verdict.message}))
        return
    table = Table("num_workers", "loader samples/s", box=None)
    for count, rate in result.loader.items():
        table.add_row(str(count), f"{rate:,.0f}")
    console.print(table)
    console.print(f"model ({result.recipe}, batch {result.batch_size}, {result.device}): "
                  f"{result.model:,.0f} samples/s")
    console.print(result.verdict.message + ".", soft_wrap=True)
    if quick and not workers:
        console.print("[dim]A quick bench; --full tries every worker count for longer.[/]")


def _parse_workers(text: str) -> list[int | str]:
    counts: list[int | str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "auto" or (part.isdigit() and int(part) >= 0):
            counts.append(part if part == "auto" else int(part))
        else:
            counts = []
            break
    if not counts:
        raise DataError(f"--workers {text!r}: give num_workers values separated by commas, e.g. auto,0,2,4.")
    return counts


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
    app.command("prepare")(prepare)
    app.add_typer(data_app, name="data")
