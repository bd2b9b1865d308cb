"""The import directions of ARCHITECTURE.md, checked over the source with `ast`.

Every `import` counts: top-level, inside a function (a lazy import is still a dependency), and under
TYPE_CHECKING. The CLI layer (cli.py, __main__, demo.py, the package root and each room's commands.py) wires
the rooms together and may import anything; the rooms below it may not reach up or sideways as listed here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "trainwise"

# A room is the first name under trainwise: a package (`data`, `train`, ...) or a top-level module. The
# top-level modules outside the CLI layer (config, errors, run, atomic, ...) are the foundation: everyone
# imports them and they import no package. For the packages, room -> {forbidden room: why}:
FORBIDDEN: dict[str, dict[str, str]] = {
    "data": {room: "data sits below training: the trainer, planner and evaluation read data, not the reverse"
             for room in ("train", "plan", "evaluate", "telemetry", "cli", "demo")},
    "telemetry": {room: "telemetry is a service the engine uses; the engine owns its callback"
                  for room in ("train", "plan", "evaluate", "data", "cli", "demo")},
    "recipes": {room: "recipes build models and data for the stages above them"
                for room in ("train", "plan", "evaluate", "cli", "demo")},
    "train": {room: "the engine does not know who plans or judges it"
              for room in ("plan", "evaluate", "doctor", "cli", "demo")},
    "plan": {room: "planning needs no run directory and no evaluation" for room in ("evaluate", "cli", "demo")},
    "doctor": {room: "doctor checks the machine, not the stages that use it"
               for room in ("train", "plan", "evaluate", "cli", "demo")},
    "evaluate": {room: "evaluation reads run directories" for room in ("plan", "doctor", "cli", "demo")},
}
# rooms that may use the engine only through `trainwise.train` (its __all__), never its modules
TRAIN_PUBLIC_API_ONLY = ("evaluate",)


def _module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, src: Path = SRC) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import statement in the file."""
    module = _module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [alias.name for alias in node.names], node.lineno))
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "trainwise":
        return None
    return parts[1] if len(parts) > 1 else ""


def _is_cli_layer(module: str) -> bool:
    return module in ("trainwise", "trainwise.cli", "trainwise.__main__", "trainwise.cli.demo") or \
        module.endswith(".commands")


def _forbidden_for(room: str, src: Path) -> dict[str, str]:
    if room in FORBIDDEN:
        return FORBIDDEN[room]
    if (src / "trainwise" / f"{room}.py").is_file():  # the foundation
        packages = [p.name for p in (src / "trainwise").iterdir() if (p / "__init__.py").is_file()]
        return {above: "the foundation (config, errors, run, ...) is imported by everyone and imports no package "
                "above it" for above in (*packages, "cli", "demo")}
    return {}


def violations(src: Path = SRC) -> list[str]:
    found = []
    for path in sorted((src / "trainwise").rglob("*.py")):
        module = _module_name(path, src)
        room = _room(module)
        forbidden = _forbidden_for(room, src)
        if _is_cli_layer(module) or not forbidden and room not in TRAIN_PUBLIC_API_ONLY:
            continue
        for target, names, line in _imports(path, src):
            target_room = _room(target)
            if target_room is None or target_room == room:
                continue
            where = f"{path.relative_to(src)}:{line} imports {target}"
            if target_room == "" and names:  # `from trainwise import train`: the room named is the target
                for name in names:
                    if name in forbidden:
                        found.append(f"{where}.{name}: {room} → {name}; {forbidden[name]}")
                continue
            if target_room in forbidden:
                found.append(f"{where}: {room} → {target_room}; {forbidden[target_room]}")
            elif target_room == "train" and room in TRAIN_PUBLIC_API_ONLY and target != "trainwise.train":
                found.append(f"{where}: {room} uses train internals; import from `trainwise.train` (its public "
                             "API) instead")
    return found


def test_no_module_imports_against_the_layering():
    assert violations() == []


def test_evaluate_uses_only_names_the_train_package_exports():
    import trainwise.train

    for path in sorted((PACKAGE / "evaluate").rglob("*.py")):
        for target, names, line in _imports(path):
            if target == "trainwise.train":
                missing = [n for n in names if n not in trainwise.train.__all__]
                assert not missing, f"{path.name}:{line}: {missing} are not in trainwise.train.__all__"
                for name in names:
                    getattr(trainwise.train, name)  # and each one resolves


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    from trainwise.train.trainer import Trainer\n", "data → train"),
    ("from trainwise.evaluate import curves\n", "data → evaluate"),
    ("import trainwise.plan.job\n", "data → plan"),
    ("from ..train import checkpoint\n", "data → train"),
    ("from trainwise import train\n", "data → train"),
])
def test_the_checker_sees_lazy_relative_and_package_imports(tmp_path, source, expected):
    fake = tmp_path / "trainwise" / "data"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake.parent / "__init__.py").write_text("")
    (fake / "leaky.py").write_text(source)
    [problem] = violations(tmp_path)
    assert expected in problem and "leaky.py" in problem


def test_the_checker_holds_evaluate_to_the_public_train_api(tmp_path):
    fake = tmp_path / "trainwise" / "evaluate"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "peek.py").write_text("from trainwise.runtime.inference import predict\nfrom trainwise.train import "
                                  "predict as fine\n")
    [problem] = violations(tmp_path)
    assert "peek.py:1" in problem and "public API" in problem


def test_the_foundation_imports_no_package(tmp_path):
    root = tmp_path / "trainwise"
    (root / "plan").mkdir(parents=True)
    (root / "plan" / "__init__.py").write_text("")
    (root / "errors.py").write_text("")
    (root / "settings.py").write_text("from trainwise import errors\n\ndef f():\n    from trainwise.plan import x\n")
    [problem] = violations(tmp_path)
    assert "settings.py:4" in problem and "settings → plan" in problem
