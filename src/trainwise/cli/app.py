"""The `trainwise` command: one Typer app. Each command parses its arguments, calls one function of the
package that owns the work, and prints. A TrainwiseError becomes its message and exit code 2."""
from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainwise.errors import ConfigWarning, RunDirError, RunDirWarning, TrainwiseError, TrainwiseWarning
from trainwise.launch.torchrun import STARTED_BY_TRAINWISE, Launch, inside_a_launch, launch

try:  # typer ≥ 0.29 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer depends on click itself
    from click.exceptions import ClickException


def _flags_take_no_value() -> None:
    """typer 0.29's help prints a type after every option, flags included (`--json <bool>`, `--help <bool>`),
    as if they took a value. A flag's type is shown as nothing."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_trainwise_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and not self.count else shown(self, ctx)

    display_type_rich._trainwise_flags = True
    TyperOption.display_type_rich = display_type_rich


_flags_take_no_value()

# One spelling for every argument placeholder, in usage lines, help panels and errors: upper case, the
# product's words for the common ones, optional ones in brackets, repeated ones followed by "...".
_PLACEHOLDERS = {"run_dir": "RUN", "run_dirs": "RUN", "overrides": "KEY=VALUE"}


def _one_placeholder_spelling() -> None:
    from typer.core import TyperArgument

    if getattr(TyperArgument, "_trainwise_placeholders", False):
        return

    def display_name_raw(self) -> str:
        return self.metavar or _PLACEHOLDERS.get(self.name, self.name.upper())

    def usage_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    TyperArgument.display_name_raw = property(display_name_raw)
    TyperArgument._usage_display_name = usage_name
    TyperArgument.display_type_rich = lambda self, ctx: None   # the placeholder says what to give
    TyperArgument._trainwise_placeholders = True


_one_placeholder_spelling()


def unwrap_help(text: str | None) -> str | None:
    """A docstring as Rich should wrap it: the line breaks inside a paragraph (kept short for the source
    file) become spaces, blank lines still part paragraphs. Rich keeps every newline it is given, which
    broke help texts mid-sentence at any terminal width."""
    if text is None:
        return None
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in paragraph.splitlines()) for paragraph in paragraphs)


def _unwrap_help_texts(typer_app: typer.Typer) -> None:
    """Every command's and group's help, unwrapped (see unwrap_help); call once all are registered."""
    for info in typer_app.registered_commands:
        info.help = unwrap_help(info.help or inspect.getdoc(info.callback))
    for group in typer_app.registered_groups:
        group.help = unwrap_help(group.help or (group.typer_instance.info.help if group.typer_instance else None))
        if group.typer_instance is not None:
            _unwrap_help_texts(group.typer_instance)

app = typer.Typer(
    name="trainwise",
    help="Plan, check, prepare, train, diagnose, evaluate and monitor PyTorch training on a GPU server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()


def _print_version(given: bool) -> None:
    if given:  # the package's own __version__ (this module is inside it: it is imported already)
        typer.echo(f"trainwise {sys.modules['trainwise'].__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")) -> None:
    """Plan, check, prepare, train, diagnose, evaluate and monitor PyTorch training on a GPU server."""

OVERRIDES_HELP = "Dotted overrides of the recipe, e.g. optim.lr=3e-4 train.max_steps=200."


@app.command()
def recipes(as_json: bool = typer.Option(False, "--json", help="Print {recipe: description} as JSON.")) -> None:
    """List the built-in recipes."""
    import json

    from trainwise.recipes import list_recipes

    if as_json:
        typer.echo(json.dumps(list_recipes(), indent=2))
        return
    table = Table("recipe", "what it trains", box=None)
    for name, description in list_recipes().items():
        table.add_row(name, description.split(":", 1)[-1].strip())
    console.print(table)


def _override_reference() -> str:
    """Every field for `train --help`, escaped: Rich reads `[llm]` in "pip install 'trainwise[llm]'" as markup."""
    from rich.markup import escape

    from trainwise.config import field_reference

    lines = ["Fields a recipe sets and key=value overrides (recipe defaults may differ):"]
    lines += [escape(f"{key} = {default!r}: {description}") for key, default, description in field_reference()]
    return "\n\n".join(lines)


@app.command(epilog=_override_reference())
def train(
    recipe: str = typer.Argument(..., help="A built-in recipe name (see `trainwise recipes`) or a YAML file."),
    overrides: Optional[list[str]] = typer.Argument(None, help=OVERRIDES_HELP),
    out: Path = typer.Option(..., "--out", "-o", metavar="RUN", help="Run directory to create."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier trainwise run in --out (moved "
                                   "aside, then deleted); anything else is refused."),
    nproc: Optional[int] = typer.Option(None, "--nproc", min=1, metavar="N", help="Ranks (GPUs) per node, "
                                        "started by PyTorch's launcher (torchrun); with train.strategy=auto the "
                                        "planner picks the strategy on each rank."),
    nnodes: int = typer.Option(1, "--nnodes", min=1, metavar="N", help="Machines in the job; more than one "
                               "needs --rdzv-endpoint."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", min=0, metavar="I",
                                            help="This machine's index, 0..nnodes-1."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", metavar="HOST:PORT", help="The address "
                                                "every node reaches (c10d rendezvous) for several machines."),
) -> None:
    """Train a recipe into a new run directory.

    Exit codes: 0 completed; 75 stopped by SIGTERM, SIGUSR1 or Ctrl-C with a checkpoint written (continue
    with `trainwise resume`); 130 aborted by a second Ctrl-C; 2 bad input; 1 a failure."""
    from trainwise.recipes import load_recipe
    from trainwise.launch.runs import train_run

    if inside_a_launch() and (os.environ.get(STARTED_BY_TRAINWISE) or not _speaks_for_the_job()):
        warnings.filterwarnings("ignore", category=ConfigWarning)  # said once: by the launcher, or by rank 0
    config = load_recipe(recipe, overrides or [])
    recipe_file = Path(recipe) if Path(recipe).is_file() else None
    if nproc is not None and not inside_a_launch():
        from trainwise.launch.runs import check_before_launch

        plan = Launch(nproc, nnodes, node_rank, rdzv_endpoint, run_id=out.name)
        plan.check()
        check_before_launch(config, plan.ranks, out, overwrite=overwrite, recipe_file=recipe_file)  # said once
        command = ["train", recipe, *(overrides or []), "--out", str(out)] + (["--overwrite"] if overwrite else [])
        raise typer.Exit(launch(command, plan, out))
    with _run_dir_os_errors(out), _exit_code_of_the_run(out):
        run = train_run(config, out, overwrite=overwrite, recipe_file=recipe_file)
    _finish(run.read_summary(), run.path)


@app.command()
def resume(run_dir: Path = typer.Argument(..., help="A run directory written by `trainwise train`."),
           overrides: Optional[list[str]] = typer.Argument(None, hidden=True),  # refused with the way to do it
           nproc: Optional[int] = typer.Option(None, "--nproc", min=1, metavar="N",
                                               help="Ranks per node, as for `train`."),
           nnodes: int = typer.Option(1, "--nnodes", min=1, metavar="N", help="Machines in the job, as for `train`."),
           node_rank: Optional[int] = typer.Option(None, "--node-rank", min=0, metavar="I",
                                                   help="This machine's index, 0..nnodes-1."),
           rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", metavar="HOST:PORT",
                                                       help="The address every node reaches, as for `train`."),
           trust_code: bool = typer.Option(False, "--trust-code", help="Run the factories a run directory made "
                                           "by someone else names (read its config.yaml first)."),
           allow_config_change: bool = typer.Option(False, "--allow-config-change", help="Accept edits of "
                                                    "config.yaml that are safe mid-run (train.max_steps, "
                                                    "logging, eval and checkpoint cadence, telemetry); other "
                                                    "edits are refused either way.")) -> None:
    """Continue a run from its last checkpoint with its saved config.

    Exit codes: 0 completed; 75 stopped again by a signal (resume it again); 130 aborted by a second Ctrl-C;
    2 bad input; 1 a failure."""
    from trainwise.launch.runs import resume_run

    if overrides:
        _refuse_resume_overrides(run_dir, overrides)
    if nproc is not None and not inside_a_launch():
        from trainwise.launch.runs import check_before_launch
        from trainwise.rundir.layout import RunDir

        plan = Launch(nproc, nnodes, node_rank, rdzv_endpoint, run_id=run_dir.name)
        plan.check()
        check_before_launch(RunDir.open(run_dir).read_config(), plan.ranks)
        command = ["resume", str(run_dir)] + (["--trust-code"] if trust_code else []) + (
            ["--allow-config-change"] if allow_config_change else [])
        raise typer.Exit(launch(command, plan, run_dir))
    with _exit_code_of_the_run(run_dir):
        run = resume_run(run_dir, trust_code=trust_code, allow_config_change=allow_config_change)
    _finish(run.read_summary(), run.path)


def _refuse_resume_overrides(run_dir: Path, overrides: list[str]) -> None:
    """`resume RUN train.max_steps=600`: a resumed run keeps its config.yaml; say how to change it there."""
    from trainwise.config.diff import SAFE_TO_CHANGE
    from trainwise.errors import ConfigError

    keys = [(item.partition("=")[0].rpartition("."), item.partition("=")[2]) for item in overrides]
    edits = "; ".join(f"`{leaf}: {value}`" + (f" under `{section}:`" if section else "")
                      for (section, _, leaf), value in keys)
    raise ConfigError(f"resume takes no KEY=VALUE overrides ({' '.join(overrides)}): a resumed run continues "
                      f"with its own {run_dir / 'config.yaml'}. Edit that file ({edits}), "
                      f"then `trainwise resume {run_dir} --allow-config-change`. Settings a resume accepts: "
                      f"{', '.join(SAFE_TO_CHANGE)}.")


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", metavar="RUN", help="Run directory to create."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier trainwise run in --out (moved "
                                   "aside, then deleted); anything else is refused."),
) -> None:
    """Train the `digits` recipe, evaluate it on its test split and say where the results are.

    Exit codes: 0 completed; 75 stopped by SIGTERM, SIGUSR1 or Ctrl-C with a checkpoint written (continue
    with `trainwise resume`, then `trainwise eval`); 130 aborted by a second Ctrl-C; 2 bad input."""
    from trainwise.cli.demo import demo_run

    with _run_dir_os_errors(out), _exit_code_of_the_run(out):
        run = demo_run(out, overwrite=overwrite, console=console)
    summary = run.read_summary()
    if summary.get("status") != "completed":
        _finish(summary, run.path)


@contextmanager
def _run_dir_os_errors(out: Path) -> Iterator[None]:
    """An OSError on `--out` itself or a file in it (`/proc/foo`, a read-only disk, a file in the way) is the
    user's choice of place, not a trainwise bug: say so, with what the system said. Other OSErrors keep
    their traceback."""
    try:
        yield
    except OSError as error:
        if error.filename is None or not _on_the_way(Path(os.fsdecode(error.filename)), out):
            raise
        raise RunDirError(f"--out {out}: cannot write the run directory there ({error.strerror or error}: "
                          f"{os.fsdecode(error.filename)}). Choose a directory you can write to, "
                          "e.g. --out runs/NAME.") from None


def _on_the_way(path: Path, out: Path) -> bool:
    """Whether `path` is `out`, a parent made for it, or a file inside it."""
    path, out = Path(os.path.abspath(path)), Path(os.path.abspath(out))
    return path == out or out in path.parents or path in out.parents


# A run stopped by a signal, checkpointed and resumable, is not a success: `train && eval` and job schedulers
# must see it. 75 is sysexits' EX_TEMPFAIL ("try again later"); 130 is the shell's code for Ctrl-C.
EXIT_STOPPED = 75
EXIT_ABORTED = 130


@contextmanager
def _exit_code_of_the_run(path: Path) -> Iterator[None]:
    """A second Ctrl-C aborts the run: say what the trainer recorded and exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        from trainwise.rundir.layout import RunDir

        try:
            summary = RunDir(path).read_summary()
        except Exception:  # nothing recorded yet (the abort came before the first step)
            summary = {}
        if summary.get("status") == "stopped":  # what the trainer wrote on the abort, not an older run's
            _print_outcome(summary, Path(path))
        else:
            console.print("aborted before training started.")
        raise typer.Exit(EXIT_ABORTED) from None


def _speaks_for_the_job() -> bool:
    """One process of a torchrun job prints its outcome and its bad-input errors: rank 0 (or a plain process)."""
    if not inside_a_launch():
        return True
    from trainwise.train.parallel.distributed import launched_ranks

    return launched_ranks().is_main


def _finish(summary: dict, path: Path) -> None:
    """Print the outcome (rank 0 of a job: the others would repeat it); a run stopped by a signal exits 75."""
    if _speaks_for_the_job():
        _print_outcome(summary, path)
    if summary.get("status") == "stopped":
        raise typer.Exit(EXIT_STOPPED)


def _print_outcome(summary: dict, path: Path) -> None:
    status, message = summary.get("status", "?"), summary.get("message")
    best = summary.get("best") or {}
    if status == "completed" and message:  # an early stop: why it ended is the headline, not "completed"
        value = f" ({best.get('metric')} = {best['value']:.4g})" if best.get("value") is not None else ""
        console.print(f"[bold]{message}[/]{value}", highlight=False)
    else:
        line = f"[bold]{status}[/] after {summary.get('steps', 0)} steps"
        if best.get("value") is not None:
            line += f"; best {best.get('metric')} = {best['value']:.4g} at step {best.get('step')}"
        console.print(line)
        if message:  # it ends with the command that continues the run: one line to copy, never cut by Rich
            console.print(message, soft_wrap=True, highlight=False)
    console.print(f"run directory: {path}", soft_wrap=True, highlight=False)  # a path to copy: never cut


def _register_command_groups() -> None:
    from trainwise.cli import data, diagnose, doctor, evaluate, plan, recsys, telemetry, text

    for group in (plan, doctor, telemetry, data, diagnose, evaluate, recsys, text):
        group.register(app)


_register_command_groups()
_unwrap_help_texts(app)


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """trainwise's own warnings as one line for the person at the terminal; others as Python shows them."""
    if issubclass(category, TrainwiseWarning):
        return f"warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


_python_format_warning = warnings.formatwarning


def main() -> None:
    warnings.formatwarning = _format_warning
    try:
        code = app(standalone_mode=False)  # a typer.Exit(code) comes back as its code here
    except TrainwiseError as error:
        if error.exit_code != 2 or _speaks_for_the_job():  # bad input is the same on every rank: said once
            said = "\n".join([str(error), *getattr(error, "__notes__", [])])  # a room's add_note: what was kept
            message = Text("error: ", style="bold red") + Text(said)
            Console(stderr=True, soft_wrap=True).print(message, highlight=False)
        sys.exit(error.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except ClickException as e:  # usage errors: a missing argument, an unknown option
        e.show()
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
