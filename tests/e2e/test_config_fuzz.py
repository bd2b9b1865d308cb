"""Whatever a user types, `trainwise train` ends in a run or in a TrainwiseError (exit 2, a message): never a
raw traceback. Issue K §1 found seven tracebacks in 340 random overrides; they are pinned below, then a
property test draws overrides over every config field (from the pydantic model itself) and the built-in
model and data arguments, valid and broken, and runs the real command in this process.

Bounded to stay fast on a 2-core CI box: at most a few optimizer steps on scikit-learn's bundled data,
valid values of fields that set the amount of work are kept small (a huge `train.max_steps` is a slow run,
not a bug), and `model.compile=true` is left out (torch.compile takes minutes on a CPU). The examples are
derandomized so CI is repeatable; TRAINWISE_FUZZ_EXAMPLES=2000 runs a longer, random search.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import sys
import tempfile
import types
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from tests.conftest import invoke
from trainwise.config import RunConfig, parse_value
from trainwise.errors import TrainwiseError
from trainwise.recipes.schemas import DATA_ARGS, MODEL_ARGS

# ---- the user's own factories, as `tests.e2e.test_config_fuzz:NAME` -------------------------------------


def raising_model(data_spec, width: int = 3):
    raise RuntimeError(f"my model does not support width {width}")


def mistyped_model(data_spec, width: int = 3):
    return len(width)  # TypeError: a bug in the user's code


def raising_data(seed: int):
    raise TypeError("my loader is broken")


def no_model(**kwargs):
    return None


# ---- the tracebacks, each now exit 2 with a message naming the field ----------------------------

FAST = ["train.max_steps=2", "schedule.warmup_steps=0", "eval.every_steps=2", "telemetry.enabled=false"]
HERE = "tests.e2e.test_config_fuzz"


@pytest.mark.parametrize("recipe, override, phrases", [
    ("digits", "model.args.channels=7", ["model.args.channels: expected a list of", "e.g. [32, 64]; got 7"]),
    ("breast-cancer", "model.args.hidden=-1", ["model.args.hidden: expected a list of", "got -1"]),
    ("digits", "model.args.channels=[0]", ["model.args.channels", "positive ints", "got [0]"]),
    ("digits", "seed=-1", ["seed:", "0 to 4294967295"]),
    ("digits", "seed=9223372036854775808", ["seed:", "0 to 4294967295"]),
    ("digits", "optim.betas=[-1, 2]", ["optim.betas.0", "optim.betas.1", "[0, 1)"]),
    ("digits", "train.device=meta", ["train.device: 'meta' is not a device training can use", "auto, cpu, cuda"]),
    ("breast-cancer", "telemetry.interval_s=1e300", ["telemetry.interval_s", "3600"]),
    ("breast-cancer", "model.factory=builtins:dict", ["model.factory: 'builtins:dict' names the Python standard "
                                                      "library"]),
    ("breast-cancer", "model.factory=os:system", ["model.factory: 'os:system' names the Python standard library"]),
    ("breast-cancer", f"model.factory={HERE}:no_model", ["model.factory: " + HERE + ":no_model returned NoneType"]),
    ("digits", "model.args.widht=3", ["model.args: cnn takes no argument 'widht'", "channels, hidden"]),
    ("digits", "data.args.size=3", ["data.args: digits takes no arguments"]),
    ("digits", "model.name=resnet", ["model.name: unknown built-in model 'resnet'", "cnn, mlp"]),
])
def test_former_tracebacks_exit_2_naming_the_field(tmp_path, capsys, recipe, override, phrases):
    result = invoke(capsys, "train", recipe, *FAST, override, "--out", str(tmp_path / "run"))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, f"{phrase!r} not in:\n{result.stderr}"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, header, raised", [
    (f"model.factory={HERE}:raising_model", f"model.factory {HERE}:raising_model(width=5, data_spec=",
     "RuntimeError: my model does not support width 5"),
    (f"model.factory={HERE}:mistyped_model", f"model.factory {HERE}:mistyped_model(width=5, data_spec=",
     "TypeError: object of type 'int' has no len()"),
    (f"data.factory={HERE}:raising_data", f"data.factory {HERE}:raising_data(seed=0)",
     "TypeError: my loader is broken"),
])
def test_a_users_factory_that_raises_shows_one_header_then_their_traceback(tmp_path, capsys, override, header,
                                                                           raised):
    args = ["model.args={width: 5}"] if override.startswith("model") else []  # the recipe's are the mlp's
    result = invoke(capsys, "train", "breast-cancer", *FAST, override, *args, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    err = result.stderr
    assert err.startswith("error: " + header), err
    assert f") raised {raised.split(':')[0]}" in err.splitlines()[0]
    # then their traceback: their frame and their line, none of trainwise's own frames
    assert "Traceback (most recent call last)" in err and __file__ in err and err.rstrip().endswith(raised)
    assert "factories.py" not in err and "cli.py" not in err


def test_a_users_model_that_does_not_fit_the_data_is_reported_as_theirs(tmp_path, capsys):
    result = invoke(capsys, "train", "digits", *FAST, "model.factory=tests.e2e.user_data:tiny_model",
                    "model.args={}", "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "tiny_model" in result.stderr
    header = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert "the forward of tests.e2e.user_data:tiny_model raised RuntimeError at step 1" in header
    assert "mat1 and mat2" in header and "Traceback" in result.stderr  # their traceback, to see where
    assert not (tmp_path / "run").exists()  # train's sanity probe met it before the run directory was made


def test_an_unwritable_out_exits_2(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    for out in ("/proc/trainwise-fuzz", str(tmp_path / "a-file" / "run")):
        result = invoke(capsys, "train", "breast-cancer", *FAST, "--out", out)
        assert result.returncode == 2, result.stderr
        assert f"--out {out}: cannot write the run directory there" in result.stderr
        assert "Traceback" not in result.stderr


# ---- the property --------------------------------------------------------------------------------------

# Fields whose valid values set the amount of work: drawn only up to these (invalid ones still in full).
WORK_CAPS = {"train.max_steps": 3, "train.epochs": 0.005, "train.batch_size": 64, "train.micro_batch_size": 64,
             "train.log_every": 50, "eval.every_steps": 50, "checkpoint.every_steps": 50,
             "checkpoint.keep_last": 5, "data.num_workers": 1, "eval.early_stopping.patience": 50,
             "schedule.warmup_steps": 50}
NEVER_TRUE = {"model.compile"}  # torch.compile: minutes per example on a CPU
# Plausible values of free-text fields (anything else is drawn as garbage)
STRINGS = {
    "train.device": ["auto", "cpu", "cuda", "cuda:1", "mps"],
    "eval.monitor": ["val/loss", "val/accuracy", "val/balanced_accuracy", "val/mae", "val/nope", "loss"],
    "model.name": ["mlp", "cnn"], "data.name": ["digits", "breast_cancer", "prepared"],
    "model.factory": ["tests.e2e.user_data:tiny_model", "builtins:dict", f"{HERE}:raising_model",
                      "no_such_pkg.mod:fn", "os:getcwd"],
    "data.factory": ["tests.e2e.user_data:good", "tests.e2e.user_data:bad_labels", f"{HERE}:raising_data"],
    "data.path": [".", "/", "tests", "/nonexistent", *(f"SCRATCH/{name}" for name in ("latin1.csv", "pipe",
                                                                                      "prepared-inf", "prepared-tiny"))],
}

GARBAGE = st.sampled_from([
    "", "~", "null", "[]", "{}", "[1, 2, 3]", "{a: 1}", "yes", "-1", "0", "1e400", "-.inf", ".nan", "0x10",
    "1_000", "'3'", "abc", "é", "[", "{", "a: b", "!!binary aGk=", "2001-12-14", "9" * 30, "&a [*a]",
    "!!python/object:os.system", "- 1", "[[1]]", "true", "3.5"])
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


def _leaves(model: type[BaseModel] = RunConfig, prefix: str = ""):
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _leaves(info.annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info.annotation, info.metadata


def _numbers(is_int: bool, metadata, cap: float | None, plausible: bool) -> st.SearchStrategy:
    """Inside the field's pydantic bounds (capped); or also its boundaries, overflows, nan and inf."""
    low, high, open_high = -10.0, 100.0 if cap is None else cap, False
    for item in metadata:
        low = max(low, getattr(item, "ge", low), getattr(item, "gt", low - 1) + 1e-6)
        high = min(high, getattr(item, "le", high))
        if getattr(item, "lt", None) is not None and item.lt <= high:
            high, open_high = item.lt, True
    inside = (st.integers(math.ceil(low), math.floor(high) - (1 if open_high and high == int(high) else 0))
              if is_int else st.floats(low, high, exclude_max=open_high))
    if plausible:
        return inside
    bounds = [v for item in metadata for v in (getattr(item, a, None) for a in ("gt", "ge", "lt", "le"))
              if v is not None]
    special = [b + d for b in bounds for d in (0, 1, -1, 1e-9, -1e-9, 0.5)] + [
        0, 1, -1, 2**31, 2**32, 2**63, 2**64, -(2**63), 10**20, 1e300, math.inf, -math.inf, math.nan]
    # valid values past the cap only make a slow run; non-integral floats stay: a wrong type for an int
    special = [v for v in special if not (cap is not None and math.isfinite(v) and v > cap)]
    return st.sampled_from(sorted(set(special), key=repr)) | inside


def _values(key: str, annotation, metadata, plausible: bool) -> st.SearchStrategy:
    """Values for one config field, from its pydantic annotation: `plausible` ones are of its type and inside
    its bounds; the others add boundaries, wrong types and garbage text."""
    cap = WORK_CAPS.get(key)
    options: list[st.SearchStrategy] = []
    parts = typing.get_args(annotation) if isinstance(annotation, types.UnionType) \
        or typing.get_origin(annotation) is typing.Union else (annotation,)
    for part in parts:
        origin = typing.get_origin(part)
        if part is bool:
            options.append(st.just(False) if key in NEVER_TRUE else st.booleans())
        elif part in (int, float):
            options.append(_numbers(part is int, metadata, cap, plausible))
        elif part is str:
            options.append(st.sampled_from(STRINGS.get(key, ["my-run"])) if plausible else TEXT)
        elif part is type(None):
            options.append(st.none())
        elif origin is typing.Literal:
            options.append(st.sampled_from(typing.get_args(part)))
        elif origin is tuple:
            options.append(st.tuples(st.floats(0, 0.999), st.floats(0, 0.999)) if plausible else
                           st.lists(st.floats(-2, 2) | st.sampled_from([0, 1, 0.999, math.nan]), max_size=3))
        elif origin is dict:
            options.append(st.just({}) if plausible else
                           st.dictionaries(st.sampled_from(["hidden", "channels", "dropout", "normalize", "x"]),
                                           st.integers(-2, 8), max_size=2))
    typed = st.one_of(options)
    if plausible:
        return typed
    drawn = st.one_of(typed, GARBAGE, TEXT)
    return drawn.filter(lambda v: not _reads_as_true(v)) if key in NEVER_TRUE else drawn


def _reads_as_true(value) -> bool:
    try:
        return TypeAdapter(bool).validate_python(parse_value(_render(value))) is True
    except (ValidationError, RecursionError):
        return False


def _render(value) -> str:
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()


def _overrides(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    return st.sampled_from(sorted(fields)).flatmap(lambda key: fields[key].map(lambda v: f"{key}={_render(v)}"))


LEAVES = list(_leaves())
# A built-in model with arguments of its schema's shapes, small: [model.name=..., model.args={...}]
BUILTIN_MODEL = st.one_of(
    st.fixed_dictionaries({}, optional={"channels": st.lists(st.integers(1, 16), min_size=1, max_size=3),
                                        "hidden": st.integers(1, 64), "dropout": st.floats(0, 0.9),
                                        "pooled_size": st.integers(1, 8)}).map(lambda a: ("cnn", a)),
    st.fixed_dictionaries({}, optional={"hidden": st.lists(st.integers(1, 64), max_size=3),
                                        "dropout": st.floats(0, 0.9)}).map(lambda a: ("mlp", a)),
).map(lambda na: [f"model.name={na[0]}", f"model.args={_render(na[1])}"])
# The user's own model and data, made for each other
USERS_OWN = st.integers(1, 16).map(lambda width: [
    "model.factory=tests.e2e.user_data:tiny_model", f"model.args={{width: {width}}}",
    "data.factory=tests.e2e.user_data:good"])
SMALL_INTS = st.integers(-2, 16) | st.sampled_from([2**20 + 1, 10**30])  # valid but huge: a slow run, not a bug
ANY_ARG = st.one_of(SMALL_INTS, st.lists(SMALL_INTS, max_size=3), st.floats(-1, 2), st.booleans(), GARBAGE,
                    st.lists(st.floats(0, 2), max_size=2))
ARG_KEYS = sorted({f"model.args.{name}" for schema in MODEL_ARGS.values() for name in schema.model_fields}
                  | {f"data.args.{name}" for schema in DATA_ARGS.values() for name in schema.model_fields}
                  | {"model.args.widht", "data.args.size"})
PLAUSIBLE = _overrides({key: _values(key, a, m, True) for key, a, m in LEAVES})
ANYTHING = st.one_of(
    _overrides({key: _values(key, a, m, False) for key, a, m in LEAVES}),
    _overrides({key: ANY_ARG for key in ARG_KEYS}),
    _overrides({key: GARBAGE for key in RunConfig.model_fields}),  # a whole section as a scalar
    TEXT,  # not even key=value
)
# Most examples change a few fields to values of the right type (so that they train, and the features they
# switch on meet), some pick a model and its arguments, about half add one arbitrary override.
OVERRIDES = st.tuples(st.lists(PLAUSIBLE, max_size=3), st.just([]) | BUILTIN_MODEL | USERS_OWN,
                      st.lists(ANYTHING, max_size=1)).map(lambda p: p[0] + p[1] + p[2])
BASE = ["train.max_steps=2", "train.batch_size=16", "train.log_every=1", "eval.every_steps=2",
        "schedule.warmup_steps=0", "telemetry.enabled=false", "checkpoint.keep_last=1"]


def _family(cls: type) -> list[type]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _family(child))]


EXIT_CODES = {0, 2} | {error.exit_code for error in _family(TrainwiseError)}  # 2: also click's usage errors


def run_train(recipe: str, overrides: list[str], out: str) -> tuple[int, str]:
    """`trainwise train` in this process: (exit code, stderr). Anything but SystemExit propagates."""
    from trainwise.cli import main

    argv, sys.argv = sys.argv, ["trainwise", "train", recipe, *overrides, "--out", out]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        assert code in EXIT_CODES, f"exit {code}: {err.getvalue()[-2000:]}"
        # the one traceback allowed is the user's own, under a header naming their factory
        assert "Traceback" not in err.getvalue() or ") raised " in err.getvalue().splitlines()[0], err.getvalue()
        return code, err.getvalue()
    finally:
        sys.argv = argv
    raise AssertionError("main() returned without exiting")


def _first_field(stderr: str) -> str:
    """The key an error message starts with (`optim.lr`, `--out ...`), to tally what the examples hit."""
    lines = [line.strip() for line in stderr.removeprefix("error: ").splitlines() if line.strip()]
    header = len(lines) > 1 and (lines[0].endswith("invalid configuration") or lines[0].startswith("invalid override"))
    line = lines[1] if header else (lines or ["?"])[0]
    return line.split(":")[0].split(" ")[0][:30]


def _user_data(scratch: Path, overrides: str) -> None:
    """The data paths the overrides name (issue 28's families): a latin-1 CSV that was never prepared, a named
    pipe, a prepared table whose inf cell was read as missing, and one of two rows (empty val and test)."""
    from trainwise.data.prepare import PrepareOptions, prepare

    if "latin1.csv" in overrides:
        (scratch / "latin1.csv").write_bytes(b"caf\xe9,label\n1,0\n2,1\n")
    if "/pipe" in overrides:
        os.mkfifo(scratch / "pipe")
    for name, rows in (("prepared-inf", ["inf,0", *(f"{i},{i % 2}" for i in range(40))]),
                       ("prepared-tiny", ["1,0", "2,1"])):
        if name in overrides:
            (scratch / f"{name}.csv").write_text("x\tlabel\n" + "\n".join(r.replace(",", "\t") for r in rows) + "\n")
            prepare(scratch / f"{name}.csv", scratch / name, PrepareOptions(), workers=1)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("TRAINWISE_FUZZ_EXAMPLES", 60)), deadline=None, database=None,
          derandomize="TRAINWISE_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(recipe=st.sampled_from(["breast-cancer", "breast-cancer", "digits", "digits", "table"]),
       overrides=OVERRIDES,
       out=st.sampled_from(["new"] * 8 + ["file", "unwritable"]))
@example(recipe="digits", overrides=["model.args.channels=7"], out="new")
@example(recipe="breast-cancer", overrides=["model.args.hidden=-1"], out="new")
@example(recipe="digits", overrides=["model.args.channels=[0]"], out="new")
@example(recipe="digits", overrides=["seed=-1"], out="new")
@example(recipe="digits", overrides=["seed=9223372036854775808"], out="new")
@example(recipe="digits", overrides=["optim.betas=[-1, 2]"], out="new")
@example(recipe="digits", overrides=["train.device=meta"], out="new")
@example(recipe="breast-cancer", overrides=["telemetry.interval_s=1e300"], out="new")
@example(recipe="breast-cancer", overrides=["model.factory=builtins:dict"], out="new")
@example(recipe="breast-cancer", overrides=[f"model.factory={HERE}:raising_model", "model.args={}"], out="new")
@example(recipe="breast-cancer", overrides=[f"data.factory={HERE}:raising_data"], out="new")
@example(recipe="breast-cancer", overrides=[], out="unwritable")
@example(recipe="breast-cancer", overrides=["train.epochs=.inf", "train.max_steps=null"], out="new")
@example(recipe="table", overrides=["data.path=SCRATCH/latin1.csv"], out="new")
@example(recipe="table", overrides=["data.path=SCRATCH/pipe"], out="new")
@example(recipe="table", overrides=["data.path=SCRATCH/prepared-inf"], out="new")
@example(recipe="table", overrides=["data.path=SCRATCH/prepared-tiny", "train.batch_size=1"], out="new")
def test_train_raises_nothing_but_trainwise_errors(recipe, overrides, out):
    scratch = Path(tempfile.mkdtemp(prefix="trainwise-fuzz-"))
    try:
        overrides = [override.replace("SCRATCH", str(scratch)) for override in overrides]
        _user_data(scratch, " ".join(overrides))
        (scratch / "file").write_text("")
        target = {"new": scratch / "run", "file": scratch / "file" / "run", "unwritable": Path("/proc/tw-fuzz")}
        code, err = run_train(recipe, BASE + overrides, str(target[out]))
        event("trained" if code == 0 else f"refused: {_first_field(err)}")  # --hypothesis-show-statistics
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
