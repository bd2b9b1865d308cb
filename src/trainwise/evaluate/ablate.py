"""`trainwise ablate RECIPE --vary key=v1,v2 --seeds N --out DIR`: what each part of a recipe is worth.

Runs the baseline and every variant for each seed, each as its own `python -m trainwise train` process (in
parallel where cores and GPUs allow), evaluates each on its test split (in this process), and writes
DIR/ablation.json and DIR/ablation.html: mean ± std of the target metric per variant, the delta against the
baseline, and whether that delta is within seed noise (a paired test over the seeds: ablation_stats). The
metric (test/accuracy, val/loss, or one class's test/<class>/recall) and every --vary value are checked
before the first run. An interrupted ablation resumes: a run whose
directory holds a completed run of the same config is reused, anything else is run again.
"""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainwise.rundir.atomic import atomic_write_json, atomic_write_text
from trainwise.config import RunConfig, metric_mode
from trainwise.config.derived import as_recorded
from trainwise.errors import ConfigError, RunDirError, TrainingError, TrainwiseError
from trainwise.evaluate.ablation_stats import summarise_variants
from trainwise.evaluate.run_eval import evaluate_run, read_eval
from trainwise.evaluate.tasks import own_evaluation
from trainwise.rundir.layout import RunDir

# Switches the built-in recipes expose, with the override that turns each one off: `--vary augmentation`.
SWITCHES = {
    "augmentation": ("data.augment", "false"),
    "weight_decay": ("optim.weight_decay", "0"),
    "warmup": ("schedule.warmup_steps", "0"),
    "amp": ("train.precision", "fp32"),
    "label_smoothing": ("train.label_smoothing", "0"),
    "dropout": ("model.args.dropout", "0"),
    "early_stopping": ("eval.early_stopping.enabled", "false"),
}
ABLATION_JSON, ABLATION_HTML = "ablation.json", "ablation.html"
BASELINE = "baseline"


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]

    @property
    def directory(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", self.name).replace("=", "-")


def parse_vary(items: list[str]) -> list[tuple[str, list[str]]]:
    """`key=v1,v2` (commas inside [] or {} stay: `model.args.hidden=[64,32],[128]`) or a switch name."""
    parsed = []
    for item in items:
        if "=" not in item:
            if item.replace("-", "_") not in SWITCHES:
                raise ConfigError(f"--vary {item!r}: write key=value1,value2 (e.g. optim.lr=1e-3,3e-3), or "
                                  f"name a switch: {', '.join(SWITCHES)}.")
            key, value = SWITCHES[item.replace("-", "_")]
            parsed.append((key, [value]))
            continue
        key, _, text = item.partition("=")
        values = [v.strip() for v in _split_top_level(text) if v.strip()]
        if not key.strip() or not values:
            raise ConfigError(f"--vary {item!r}: give a key and at least one value, e.g. data.augment=false.")
        parsed.append((key.strip(), values))
    return parsed


def plan_variants(recipe: str, vary: list[tuple[str, list[str]]], *, mode: str = "one-at-a-time",
                  overrides: list[str] = ()) -> tuple[list[Variant], list[str]]:
    """(baseline then each variant, the requested variants left out because their config is the baseline's
    or an earlier variant's)."""
    if mode not in ("one-at-a-time", "grid"):
        raise ConfigError(f"--mode {mode!r}: choose one-at-a-time or grid.")
    if not vary:
        raise ConfigError("nothing to ablate: add --vary key=v1,v2 (or a switch name such as --vary dropout).")
    baseline_config = _config(recipe, list(overrides))
    if mode == "grid":
        combos = [tuple(f"{k}={v}" for k, v in zip([k for k, _ in vary], values))
                  for values in itertools.product(*[vs for _, vs in vary])]
    else:
        combos = [(f"{key}={value}",) for key, values in vary for value in values]
    variants, seen, skipped = [Variant(BASELINE, ())], {_fingerprint(baseline_config)}, []
    for combo in combos:
        fingerprint = _fingerprint(_config(recipe, [*overrides, *combo]))  # a bad key fails here, before runs
        if fingerprint in seen:
            skipped.append(",".join(combo))
            continue
        seen.add(fingerprint)
        variants.append(Variant(",".join(combo), combo))
    if len(variants) == 1:
        raise ConfigError(f"every --vary value is the recipe's own setting ({', '.join(skipped)}), or runs as it "
                          "on this machine, so there is nothing to compare; vary something the recipe does "
                          "differently.")
    return variants, skipped


def ablate(recipe: str, vary: list[str], *, out: str | os.PathLike, seeds: int = 3,
           mode: Literal["one-at-a-time", "grid"] = "one-at-a-time", metric: str | None = None,
           overrides: list[str] = (), workers: int | None = None,
           on_progress: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """Run (or reuse) every variant × seed, then write DIR/ablation.json and DIR/ablation.html."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: need at least 1 (3 or more to tell a change from noise).")
    out = Path(out)
    base = _config(recipe, list(overrides))
    metric = metric or _default_metric(base)
    split, _, metric_name = metric.partition("/")
    if split not in ("val", "test") or not metric_name:
        raise ConfigError(f"--metric {metric!r}: write it as test/<metric> or val/<metric>, e.g. "
                          "test/balanced_accuracy, or test/<class>/<precision|recall|f1> for one class.")
    variants, skipped = plan_variants(recipe, parse_vary(vary), mode=mode, overrides=list(overrides))
    check_metric(base, metric)  # before the first run, not after every variant has trained
    if skipped:
        on_progress(f"left out (same config as the baseline or an earlier variant, as run on this machine): "
                    f"{', '.join(skipped)}")
    jobs = [(v, base.seed + k, out / v.directory / f"seed{k}") for v in variants for k in range(seeds)]
    workers = workers or default_workers(len(jobs))
    started = time.time()
    on_progress(f"{len(variants)} variants × {seeds} seeds = {len(jobs)} runs, {workers} at a time")

    def run_job(index: int, job: tuple[Variant, int, Path]) -> dict[str, Any]:
        variant, seed, path = job
        run_overrides = [*overrides, *variant.overrides, f"seed={seed}"]
        outcome = _run_one(recipe, run_overrides, path, split=split, log=out / "logs" / f"{path.parent.name}"
                           f"-{path.name}.log", env=_child_env(index, workers))
        outcome.update(variant=variant.name, seed=seed, path=str(path),
                       value=_metric_value(RunDir(path), split, metric_name) if outcome["ok"] else None)
        on_progress(f"{variant.name} seed {seed}: {outcome['status']}"
                    + (" (reused)" if outcome["reused"] else "") +
                    (f", {metric} = {outcome['value']:.4g}" if outcome["value"] is not None else ""))
        return outcome

    out.mkdir(parents=True, exist_ok=True)
    pool = ThreadPoolExecutor(max_workers=workers)  # threads only wait on child processes
    try:
        futures = [pool.submit(run_job, index, job) for index, job in enumerate(jobs)]
        outcomes = [future.result() for future in futures]
    except BaseException:  # Ctrl-C: the running children get it too; start no queued run
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    goal = metric_mode(metric)
    result = {
        "recipe": recipe, "overrides": list(overrides), "vary": list(vary), "mode": mode, "seeds": seeds,
        "metric": metric, "goal": "lower is better" if goal == "min" else "higher is better",
        "workers": workers, "wall_s": round(time.time() - started, 2), "skipped": skipped,
        **summarise_variants([v.name for v in variants], outcomes, goal=goal),
        "runs": outcomes,
    }
    atomic_write_json(out / ABLATION_JSON, result)
    atomic_write_text(out / ABLATION_HTML, render_ablation_html(result))
    if not any(o["ok"] for o in outcomes if o["variant"] == BASELINE):
        raise TrainingError(f"every baseline run failed, so no variant can be compared; see the logs in "
                            f"{out / 'logs'} (results so far: {out / ABLATION_JSON}).")
    return result


_NOT_METRICS = {"samples", "num_classes"}
PER_CLASS_STATS = ("precision", "recall", "f1")
RANKING_METRIC = "test/ndcg@10"  # a recommender is compared on its full-ranking NDCG@10, not its training loss


def _default_metric(config: RunConfig) -> str:
    """The recipe's monitored metric on the test split; NDCG@10 for data that ranks a catalogue itself."""
    from trainwise.recipes.factories import build_data

    if own_evaluation(build_data(config).test) is not None:
        return RANKING_METRIC
    return f"test/{config.eval.monitor.split('/')[-1]}"


def metric_names(config: RunConfig) -> tuple[str, dict[str, list[str]]] | None:
    """(task, {"val": [...], "test": [...]}): the metrics a run of `config` records, found by running the
    training loop's and the evaluation's own metric code on a few made-up outputs for the data's task. None
    when that cannot tell (a dataset with its own evaluation, a task without made-up outputs)."""
    import torch

    from trainwise.evaluate.tasks import TASKS
    from trainwise.recipes.factories import build_data
    from trainwise.runtime.inference import headline_metrics

    bundle = build_data(config)  # a bad data setting is a ConfigError/DataError here: exit 2 before any run
    spec = bundle.spec
    if own_evaluation(bundle.test) is not None or spec.task not in TASKS:
        return None
    if spec.task == "classification":
        classes = max(2, spec.num_classes or 2)
        targets = torch.arange(classes).repeat(2)
        outputs = torch.randn(len(targets), classes, generator=torch.Generator().manual_seed(0))
    elif spec.task == "regression":
        targets, outputs = torch.tensor([0.0, 1.0, 2.0, 4.0]), torch.tensor([[0.5], [1.0], [2.5], [3.0]])
    else:
        return None
    val = headline_metrics(outputs, targets, spec.task, lambda out, target: torch.tensor(0.0))
    test = TASKS[spec.task].metrics(outputs, targets, spec.class_names)
    test_names = [k for k, v in test.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in _NOT_METRICS]
    if "macro" in test:
        test_names.append("macro_f1")
    # one class's precision, recall or F1 (the recall of `malignant`): test/<class>/<statistic>
    test_names += [f"{row['class']}/{stat}" for row in test.get("per_class", []) for stat in PER_CLASS_STATS]
    return spec.task, {"val": list(val), "test": test_names}


def check_metric(config: RunConfig, metric: str) -> None:
    """Refuse a `--metric` the runs will not record (ConfigError), naming the ones they will."""
    import difflib

    found = metric_names(config)
    if found is None:
        return
    task, names = found
    split, _, name = metric.partition("/")
    if name in names[split]:
        return
    close = difflib.get_close_matches(name, names[split], n=1)
    hint = f" Did you mean {split}/{close[0]}?" if close else ""
    overall = [n for n in names[split] if "/" not in n]
    classes = list(dict.fromkeys(n.rpartition("/")[0] for n in names[split] if "/" in n))
    per_class = (f"; and per class, {split}/<class>/<{'|'.join(PER_CLASS_STATS)}> for the classes "
                 + ", ".join(repr(c) for c in classes)) if classes else ""
    raise ConfigError(f"--metric {metric!r}: a {task} run records no {split} metric {name!r}.{hint} It records: "
                      + ", ".join(f"{split}/{n}" for n in overall) + per_class + ".")


def default_workers(jobs: int) -> int:
    """One process per usable core on the CPU (each with one thread), one per GPU when there are GPUs."""
    import torch

    from trainwise.data.loader import usable_cores

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(1, min(jobs, gpus or usable_cores()))


def _run_one(recipe: str, overrides: list[str], path: Path, *, split: str, log: Path,
             env: dict[str, str]) -> dict[str, Any]:
    trained = _completed_with_config(path, _config(recipe, overrides))
    needs_eval = split == "test"
    if trained and (not needs_eval or read_eval(RunDir(path), "test") is not None):
        return {"ok": True, "status": "completed", "reused": True}
    if not trained:
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "trainwise", "train", recipe, *overrides, "--out", str(path),
                   "--overwrite"]
        with open(log, "w", encoding="utf-8") as stream:
            stream.write("$ " + " ".join(command) + "\n")
            stream.flush()
            code = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, env=env).returncode
        if code != 0:
            return {"ok": False, "status": "failed", "reused": False,
                    "error": f"`trainwise train` exited {code}; see {log}: {_tail(log)}"}
    status = RunDir(path).read_summary().get("status", "unknown")
    if status == "completed" and needs_eval:
        # in this process: a second interpreter start per run would cost more than the evaluation
        try:
            evaluate_run(path, split="test")
        except TrainwiseError as error:
            return {"ok": False, "status": "failed", "reused": trained, "error": f"evaluation: {error}"}
    return {"ok": status == "completed", "status": status, "reused": trained}


def _completed_with_config(path: Path, config: RunConfig) -> bool:
    """A finished run of exactly this config (the same recipe, overrides and seed) is already there: what the
    resolve step decided for it (config.yaml's numbers for `auto`) counts as asked."""
    try:
        run = RunDir.open(path)
        recorded = run.read_config()
        return (run.read_summary().get("status") == "completed"
                and _fingerprint(recorded) == _fingerprint(config, recorded.model_dump(mode="json")))
    except (RunDirError, ConfigError, ValueError):
        return False


def _metric_value(run: RunDir, split: str, name: str) -> float | None:
    if split == "test":
        evaluation = read_eval(run, "test") or {}
        if name == "macro_f1":
            return (evaluation.get("macro") or {}).get("f1")
        if "/" in name:  # <class>/<statistic>; None when the test split holds no sample of the class
            label, _, stat = name.rpartition("/")
            rows = [r for r in evaluation.get("per_class", []) if r.get("class") == label]
            if not rows or stat not in PER_CLASS_STATS:
                raise ConfigError(f"--metric test/{name}: the evaluation has no class {label!r}; it has "
                                  + ", ".join(repr(r.get("class")) for r in evaluation.get("per_class", [])) + ".")
            return rows[0][stat]
        value = evaluation.get(name)
        if not isinstance(value, (int, float)):
            raise ConfigError(f"--metric test/{name}: the evaluation has no scalar {name!r}; it has "
                              + ", ".join(k for k, v in evaluation.items() if isinstance(v, float)) + ".")
        return float(value)
    # val: the value at the step the run chose as best (the weights it keeps), else its last evaluation
    records = run.read_metrics("val")
    best_step = (run.read_summary().get("best") or {}).get("step")
    chosen = [r for r in records if r.get("step") == best_step] or records[-1:]
    if not chosen or name not in chosen[0]:
        raise ConfigError(f"--metric val/{name}: the run logged no val {name!r}.")
    return float(chosen[0][name])


def _child_env(index: int, workers: int) -> dict[str, str]:
    from trainwise.data.loader import usable_cores

    env = dict(os.environ)
    # share the cores this process may use instead of every child claiming all of them
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, usable_cores() // workers))
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    if not gpus:
        import torch

        gpus = [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    if len(gpus) > 1:
        env["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
    return env


def _config(recipe: str, overrides: list[str]) -> RunConfig:
    from trainwise.recipes import load_recipe

    return load_recipe(recipe, overrides)


def _fingerprint(config: RunConfig, recorded: dict | None = None) -> str:
    """The config as it would run on this machine: `train.device` and `train.precision` resolved, so that
    precision=auto and precision=fp32 on a CPU (where auto is fp32) are one config, not two identical runs."""
    from trainwise.runtime.device import resolve_device
    from trainwise.runtime.precision import resolve_precision

    dumped = as_recorded(config.model_dump(mode="json"), recorded or {})
    try:
        device = resolve_device(config.train.device)
        dumped["train"].update(device=device.type, precision=resolve_precision(dumped["train"]["precision"], device))
    except TrainwiseError:
        pass  # a device or precision this machine cannot run: its run says why; compare it as written
    return repr(dumped)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{"
        depth -= char in "]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def _tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:])


def render_ablation_html(result: dict[str, Any]) -> str:
    import jinja2

    from trainwise.evaluate import plots

    rows = result["variants"]
    chart = plots.bar_chart_with_errors(
        f"{result['metric']} (mean ± std over seeds; red: beyond seed noise)",
        [r["name"] for r in rows], [r["mean"] if r["mean"] is not None else 0.0 for r in rows],
        [r["std"] or 0.0 for r in rows], result["metric"],
        highlight=[r["within_noise"] is False for r in rows])
    template = Path(__file__).with_name("ablation_template.html").read_text(encoding="utf-8")
    return jinja2.Environment(autoescape=True).from_string(template).render(result=result, chart=chart)
