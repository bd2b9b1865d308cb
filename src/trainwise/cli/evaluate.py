"""`trainwise eval`, `report`, `compare`, `ablate`; cli/app.py calls register(app)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()

RUN_HELP = "A run directory written by `trainwise train`."


def register(app: typer.Typer) -> None:
    """Add this room's commands to the trainwise app."""
    app.command("eval")(eval_command)
    app.command("report")(report_command)
    app.command("compare")(compare_command)
    app.command("ablate")(ablate_command)


def eval_command(
    run_dir: Path = typer.Argument(..., metavar="RUN_OR_MODEL", help=f"{RUN_HELP} With --data: a language "
                                   "model no run trained (a local Hugging Face directory or a .gguf file), scored "
                                   "as it is."),
    split: str = typer.Option("test", help="Which split to measure: test, val or train."),
    checkpoint: str = typer.Option("best", help="Weights: best or last checkpoint, or final: the run's last "
                                   "step (model.safetensors, or the last checkpoint when early stopping "
                                   "restored the best weights into model.safetensors)."),
    before: bool = typer.Option(False, "--before", help="Also score the model as the run started (model.hf's "
                                "own weights, or its random initialisation) on the same split: before vs after."),
    data: Optional[Path] = typer.Option(None, "--data", help="A prepared dataset (text or instruction data, "
                                        "prepared with the model's --tokenizer) to score the model RUN_OR_MODEL "
                                        "on, untrained; nothing is written."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as JSON instead of tables."),
    trust_code: bool = typer.Option(False, "--trust-code", help="Run the factories a run directory made by "
                                    "someone else names (read its config.yaml first)."),
) -> None:
    """Measure a run on a split: every metric, the confusion matrix, warnings; writes RUN/eval/. `--before` adds
    the untrained model's figures; `eval MODEL --data DIR` scores a model that no run trained."""
    from trainwise.evaluate.run_eval import evaluate_run

    if data is not None:
        _eval_model(run_dir, data, split, as_json)
        return
    if not (run_dir / "config.yaml").is_file() and _looks_like_a_model(run_dir):
        from trainwise.errors import ConfigError

        raise ConfigError(f"{run_dir} is a model, not a run directory: score it on prepared data with `trainwise "
                          f"eval {run_dir} --data DIR` (DIR prepared with --tokenizer {run_dir}).")
    result = evaluate_run(run_dir, split=split, checkpoint=checkpoint, trust_code=trust_code,  # type: ignore[arg-type]
                          before=before)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    title = f"{split} split, {result['checkpoint']} weights (step {result.get('step')})"
    console.print(_before_after(result, title) if before else _metrics_table(result, title))
    if result.get("per_class"):
        per_class = Table("class", "precision", "recall", "F1", "support", "predicted", box=None)
        for row in result["per_class"]:
            per_class.add_row(row["class"], *(f"{row[k]:.3f}" if row[k] is not None else "—"
                                              for k in ("precision", "recall", "f1")),
                              str(row["support"]), str(row["predicted"]))
        console.print(per_class)
    tuned = result.get("finetune")
    if tuned:  # a fine-tune on instruction data: exact match on the held-out prompts, base vs tuned answers
        from trainwise.evaluate.report_lm import exact_match_headline, shown_answer

        console.print(f"{exact_match_headline(tuned)}; loss, perplexity and token accuracy above are on the "
                      "answers only", highlight=False)
        answers = Table("prompt", "reference", "base", "tuned", box=None, title="base and tuned answers")
        for row in tuned["side_by_side"]:
            answers.add_row(row["prompt"], row.get("reference", ""), shown_answer(row["base"]),
                            shown_answer(row["tuned"]))
        console.print(answers)
        if result["files"].get("answers"):
            console.print(f"every held-out answer, tuned and base: {result['files']['answers']}", highlight=False)
    _print_warnings(result["warnings"])
    console.print(f"written: {Path(result['files']['metrics']).parent}")


def _looks_like_a_model(path: Path) -> bool:
    return path.suffix == ".gguf" or (path / "config.json").is_file()


def _metrics_table(result: dict, title: str) -> Table:
    from trainwise.evaluate.report import headline

    table = Table("metric", "value", "compare with", box=None, title=title)
    for metric, value, compare in headline(result):
        table.add_row(metric, value, compare)
    return table


def _before_after(result: dict, title: str) -> Table:
    """The headline metrics of the untrained model beside the run's (`eval --before`)."""
    from trainwise.evaluate.readable import fmt
    from trainwise.evaluate.report import headline

    before = result["before"]
    table = Table("metric", "before (untrained)", "after", "compare with", box=None, title=title)
    for (metric, after, compare), (_, untrained, _) in zip(headline(result), headline(before)):
        table.add_row(metric, untrained, after, compare)
    if "exact_match" in before and result.get("finetune"):
        table.add_row("exact match", fmt(before["exact_match"]), fmt(result["finetune"]["exact_match"]),
                      "held-out prompts answered exactly (greedy)")
    return table


def _eval_model(model: Path, data: Path, split: str, as_json: bool) -> None:
    """`trainwise eval MODEL --data DIR`: the model as it is, on the data's split; nothing written."""
    from trainwise.evaluate.model_eval import evaluate_model_on_data
    from trainwise.evaluate.report_lm import exact_match_headline, shown_answer

    if (model / "config.yaml").is_file():
        from trainwise.errors import ConfigError

        raise ConfigError(f"{model} is a run directory: `trainwise eval {model}` scores it on its own data "
                          "(add --before for the model before training); --data is for a model no run trained.")
    result = evaluate_model_on_data(model, data, split)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    console.print(_metrics_table(result, f"{split} split of {data}, {model} (untrained)"))
    scored = result.get("instruct")
    if scored:
        console.print(f"{exact_match_headline(scored)}; loss, perplexity and token accuracy above are on the "
                      "answers only", highlight=False)
        answers = Table("prompt", "reference", "answer", box=None, title="answers (the first ones; all with --json)")
        for row in scored["examples"][:5]:
            answers.add_row(row["prompt"], row["reference"], shown_answer(row["answer"]))
        console.print(answers)
    _print_warnings(result["warnings"])


def report_command(
    run_dir: Path = typer.Argument(..., help=RUN_HELP),
    fmt: str = typer.Option("html", "--format", help="html (one self-contained file) or md."),
) -> None:
    """Write RUN/report.html (or report.md) from the run directory alone."""
    from trainwise.evaluate.report import write_report

    path = write_report(run_dir, fmt=fmt)  # type: ignore[arg-type]
    console.print(f"report: {path}")


def compare_command(
    run_dirs: list[Path] = typer.Argument(..., help="Two or more run directories."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Side by side: the config keys that differ between runs, and their final, best and test metrics."""
    from trainwise.errors import ConfigError
    from trainwise.evaluate.compare import compare_runs, config_value
    from trainwise.evaluate.readable import fmt

    if len(run_dirs) < 2:
        raise ConfigError(f"compare needs two or more run directories; got one ({run_dirs[0]}). To look at one "
                          f"run: `trainwise eval {run_dirs[0]}` or `trainwise report {run_dirs[0]}`.")
    result = compare_runs(run_dirs)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    table = Table("", *result["names"], box=None)
    if result["config_differences"]:
        table.add_row("[bold]config[/]", *[""] * len(result["names"]))
        for key, values in result["config_differences"].items():
            table.add_row(key, *(config_value(v) for v in values))
    else:
        table.add_row("[bold]config[/]", *["(identical)"] * len(result["names"]))
    table.add_row("[bold]metrics[/]", *[""] * len(result["names"]))
    for key, values in result["metrics"].items():
        table.add_row(key, *(fmt(v) for v in values))
    console.print(table)
    for note in result.get("notes", []):
        console.print(Text(note), soft_wrap=True)


def ablate_command(
    recipe: str = typer.Argument(..., help="A built-in recipe name or a YAML file."),
    overrides: Optional[list[str]] = typer.Argument(None, help="Dotted overrides applied to every run."),
    vary: list[str] = typer.Option(..., "--vary", help="key=v1,v2 to try, or a switch name: augmentation, "
                                   "weight_decay, warmup, amp, label_smoothing, dropout, early_stopping. "
                                   "Repeat for several."),
    seeds: int = typer.Option(3, help="Seeds per variant, the same seeds for every variant, compared in pairs "
                              "(with 6+ the exact test can show an effect at p < 0.05; 3 only hints)."),
    mode: str = typer.Option("one-at-a-time", help="one-at-a-time (each change alone) or grid (all "
                             "combinations)."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory of the ablation; rerun to resume."),
    metric: Optional[str] = typer.Option(None, help="test/<metric>, val/<metric> or one class's "
                                         "test/<class>/<precision|recall|f1> to compare; default: the recipe's "
                                         "monitored metric on the test split."),
    workers: Optional[int] = typer.Option(None, help="Runs at a time (default: one per core, or per GPU)."),
) -> None:
    """Train the baseline and each variant for several seeds; table of mean ± std, delta and noise test."""
    from trainwise.evaluate.ablate import ABLATION_HTML, ABLATION_JSON, ablate

    try:
        result = ablate(recipe, vary, out=out, seeds=seeds, mode=mode, metric=metric,  # type: ignore[arg-type]
                        overrides=overrides or [], workers=workers, on_progress=console.print)
    except KeyboardInterrupt:
        console.print(f"interrupted: completed runs are kept; run the same command again to resume ({out}).")
        raise typer.Exit(130) from None
    table = Table("variant", f"{result['metric']} mean ± std", "n", "Δ vs baseline",
                  "p exact / paired t / Welch", "verdict", box=None)
    for row in result["variants"]:
        p_values = "" if row["p_value"] is None else " / ".join(
            "—" if p is None else f"{p:.3g}" for p in (row.get("p_exact"), row.get("p_paired_t"), row.get("p_welch")))
        table.add_row(row["name"], "—" if row["mean"] is None else f"{row['mean']:.4f} ± {row['std']:.4f}",
                      str(row["n"]), "" if row["delta"] is None else f"{row['delta']:+.4f}", p_values,
                      _short(row["verdict"]))  # the why, below the table: a narrow column folds it
    console.print(table)
    for row in result["variants"]:
        if _short(row["verdict"]) != row["verdict"]:
            console.print(f"{row['name']}: {row['verdict']}", highlight=False)
    for run in result["runs"]:
        if not run["ok"]:
            console.print(f"[red]failed[/] {run['variant']} seed {run['seed']}: {run.get('error', run['status'])}",
                          highlight=False)
    console.print(f"noise test: {result['test']}")
    console.print(f"written: {out / ABLATION_JSON}, {out / ABLATION_HTML} ({result['wall_s']:.1f} s)")


def _short(verdict: str) -> str:
    """A verdict without its reasons: `too few seeds to tell` of `too few seeds to tell: with 3 ...`."""
    return verdict.split(":")[0].split(" (")[0]


def _print_warnings(warnings: list[dict]) -> None:
    for warning in warnings:
        colour = "red" if warning["severity"] == "error" else "yellow"
        console.print(f"[{colour}]{warning['severity']}[/] {warning['kind']}: {warning['message']}",
                      highlight=False)
