"""The import directions of ARCHITECTURE.md, checked over the source with `ast`.

Every `import` counts: top-level, inside a function (a lazy import is still a dependency), and under
TYPE_CHECKING. A room is the first name under `trainwise` (a package such as `train`, or a module such as
`errors`). Every room is listed in ALLOWED with the rooms it may import; there are no exemptions, and a new
room fails here until it is given its place. The README's "Layout" section lists every room, each above the
rooms it may import, and a test holds the list and the table to each other.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "trainwise"

FOUNDATIONS = frozenset({"errors", "findings", "config", "rundir"})
_F = FOUNDATIONS
# room -> the rooms it may import (besides itself). Imports point down: the face (cli) above the rooms, the
# rooms above the engine, the engine above runtime/data/recipes, everything above the foundations.
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "findings": frozenset({"errors"}),
    "config": frozenset({"errors"}),
    "rundir": frozenset({"config", "errors"}),
    "data": _F | {"llm"},  # a --tokenizer that is a GGUF file goes through the one door to Hugging Face
    "runtime": _F | {"data", "llm"},
    "telemetry": _F,
    "llm": _F,
    "recsys": _F | {"data", "runtime"},
    "text": _F | {"data", "runtime", "llm"},
    "diagnose": _F | {"telemetry"},
    "recipes": _F | {"data", "recsys", "text", "llm"},
    "train": _F | {"runtime", "data", "recipes", "telemetry", "diagnose", "llm", "text"},
    "check": _F | {"train", "runtime", "data", "recipes", "diagnose", "llm"},
    "plan": _F | {"train", "runtime", "data", "recipes", "llm"},
    "doctor": _F | {"data", "telemetry"},
    "evaluate": _F | {"runtime", "data", "recipes", "recsys", "diagnose", "text", "llm"},
    "launch": _F | {"check", "plan", "train", "runtime", "data", "recipes"},
    "cli": _F | {"data", "runtime", "telemetry", "recsys", "diagnose", "recipes", "train", "check", "plan",
                 "doctor", "evaluate", "launch", "text", "llm"},
    "__main__": frozenset({"cli"}),
    "": _F | {"data", "train"},  # the package root: `from trainwise import Trainer, RunDir, DataSpec`
}
# the rules a reader of ARCHITECTURE.md looks for, said in words when broken
NEVER: dict[tuple[str, str], str] = {
    ("evaluate", "train"): "evaluation reads the run directory (rundir) and runs models through runtime, never the engine",
    ("diagnose", "train"): "diagnose holds pure rules over what a run recorded; probes that train live in check",
    ("diagnose", "check"): "diagnose holds pure rules over what a run recorded; probes that train live in check",
    ("train", "check"): "the probes stand on the engine, not the reverse",
    ("train", "launch"): "the engine does not know who starts it",
    ("train", "plan"): "the engine does not know who plans it",
    ("train", "evaluate"): "the engine does not know who judges it",
}
TERMINAL_LIBRARIES = ("typer", "click")  # only the face (cli/) knows the terminal's argument parsing
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60  # a module holds one concept, a function does one thing


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


def _edges(src: Path = SRC) -> list[tuple[str, str, str]]:
    """(room, imported room, where) for every import of another room."""
    found = []
    for path in sorted((src / "trainwise").rglob("*.py")):
        room = _room(_module_name(path, src))
        for target, names, line in _imports(path, src):
            target_room = _room(target)
            if target_room is None:
                continue
            where = f"{path.relative_to(src)}:{line} imports {target}"
            # `from trainwise import train`: the room named is the target
            targets = [(name, f"{where}.{name}") for name in names] if target_room == "" and names else \
                [(target_room, where)]
            found += [(room, t, w) for t, w in targets if t != room]
    return found


def violations(src: Path = SRC) -> list[str]:
    found = []
    for room, target, where in _edges(src):
        if room not in ALLOWED:
            found.append(f"{where}: {room!r} is a room ALLOWED does not list; give it its place in "
                         "tests/test_architecture.py and ../shared/ARCHITECTURE.md")
        elif target not in ALLOWED[room]:
            why = NEVER.get((room, target)) or f"{room} may import only {', '.join(sorted(ALLOWED[room])) or 'nothing'}"
            found.append(f"{where}: {room} → {target}; {why}")
    return found


def cycles(src: Path = SRC) -> list[list[str]]:
    """Every room that reaches itself through the imports, with the path it takes."""
    graph: dict[str, set[str]] = {}
    for room, target, _ in _edges(src):
        graph.setdefault(room, set()).add(target)
    found = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    found.append([*path, start])
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return found


def terminal_imports(src: Path = SRC) -> list[str]:
    found = []
    for path in sorted((src / "trainwise").rglob("*.py")):
        if _room(_module_name(path, src)) == "cli":
            continue
        for target, _, line in _imports(path, src):
            if target.split(".")[0] in TERMINAL_LIBRARIES:
                found.append(f"{path.relative_to(src)}:{line} imports {target}; only cli/ knows the terminal")
    return found


def test_every_room_imports_only_the_rooms_below_it():
    assert violations() == []


def test_no_room_reaches_itself_through_its_imports():
    assert cycles() == []


def test_evaluate_and_diagnose_import_nothing_from_the_engine():
    edges = {(room, target) for room, target, _ in _edges()}
    assert ("evaluate", "train") not in edges and ("diagnose", "train") not in edges


def test_typer_is_imported_only_by_the_face():
    assert terminal_imports() == []


def oversized(src: Path = SRC) -> list[str]:
    found = []
    for path in sorted((src / "trainwise").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(src)}: {len(text.splitlines())} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # the body: a command's parameter list is a declaration (its options and their help), not logic
                length = node.end_lineno - node.body[0].lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(src)}:{node.lineno} {node.name}: {length} lines "
                                 f"(at most {MAX_FUNCTION_LINES})")
    return found


def test_modules_and_functions_stay_small():
    assert oversized() == []


def test_every_room_on_disk_has_its_place():
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    rooms |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert rooms - set(ALLOWED) == set()


README = SRC.parent / "README.md"


def readme_layout(readme: Path = README) -> list[str]:
    """The rooms the README's Layout section lists, top to bottom (`__init__.py` is the package root, "")."""
    text = readme.read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    rooms = []
    for line in block.splitlines():
        name = line[2:].split(" ")[0] if line.startswith("  ") and not line.startswith("   ") else ""
        if name.endswith("/") or name.endswith(".py"):
            stem = name.rstrip("/").removesuffix(".py")
            rooms.append("" if stem == "__init__" else stem)
    return rooms


def layout_disagreements(layout: list[str]) -> list[str]:
    """Where the README's list and ALLOWED disagree: a room missing from either, or a room allowed to import
    one the list puts above it (imports point down the list)."""
    found = [f"{room or '__init__.py'} is in ALLOWED but not in the README's Layout" for room in ALLOWED
             if room not in layout]
    found += [f"{room} is in the README's Layout but not in ALLOWED" for room in layout if room not in ALLOWED]
    position = {room: index for index, room in enumerate(layout)}
    for room, targets in ALLOWED.items():
        for target in sorted(targets):
            if room in position and target in position and position[target] < position[room]:
                found.append(f"{room or '__init__.py'} may import {target}, which the README lists above it")
    return found


def test_the_readme_layout_lists_every_room_in_the_order_of_the_import_table():
    assert layout_disagreements(readme_layout()) == []


def test_the_layout_check_sees_a_missing_room_and_an_upward_import():
    layout = [room for room in readme_layout() if room != "llm"]
    assert "llm is in ALLOWED but not in the README's Layout" in layout_disagreements(layout)
    upside_down = ["errors", *[room for room in readme_layout() if room != "errors"]]
    assert "config may import errors, which the README lists above it" in layout_disagreements(upside_down)


def _fake_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "trainwise"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != root and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    from trainwise.train.loop.trainer import Trainer\n", "data → train"),
    ("from trainwise.evaluate import curves\n", "data → evaluate"),
    ("import trainwise.plan.job\n", "data → plan"),
    ("from ..train import checkpoint\n", "data → train"),
    ("from trainwise import train\n", "data → train"),
])
def test_the_checker_sees_lazy_relative_and_package_imports(tmp_path, source, expected):
    [problem] = violations(_fake_tree(tmp_path, {"data/leaky.py": source}))
    assert expected in problem and "leaky.py" in problem


def test_the_checker_says_why_evaluation_may_not_use_the_engine(tmp_path):
    [problem] = violations(_fake_tree(tmp_path, {"evaluate/peek.py": "from trainwise.train.step.train_step import TrainStep\n"}))
    assert "peek.py:1" in problem and "evaluate → train" in problem and "runtime" in problem


def test_the_foundation_imports_no_room(tmp_path):
    src = _fake_tree(tmp_path, {"errors.py": "", "plan/__init__.py": "",
                                "config/load.py": "from trainwise import errors\n\ndef f():\n    from trainwise.plan import x\n"})
    [problem] = violations(src)
    assert "load.py:4" in problem and "config → plan" in problem


def test_the_checker_finds_a_cycle_and_a_room_without_a_place(tmp_path):
    src = _fake_tree(tmp_path, {"data/a.py": "from trainwise.recipes import b\n",
                                "recipes/b.py": "from trainwise.data import a\n",
                                "extras/c.py": "from trainwise import errors\n"})
    assert ["data", "recipes", "data"] in cycles(src)
    assert any("'extras' is a room ALLOWED does not list" in problem for problem in violations(src))


def test_the_size_check_sees_a_long_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES + 1))
    params = "".join(f"    p{i}: int = {i},\n" for i in range(MAX_FUNCTION_LINES))  # a signature is not counted
    src = _fake_tree(tmp_path, {"data/long.py": f"def long(\n{params}):\n{body}",
                                "data/wide.py": f"def wide(\n{params}):\n    return 0\n"})
    assert oversized(src) == [f"trainwise/data/long.py:1 long: {MAX_FUNCTION_LINES + 1} lines (at most 60)"]


def test_the_checker_finds_typer_outside_the_face(tmp_path):
    src = _fake_tree(tmp_path, {"plan/commands.py": "import typer\n", "cli/plan.py": "import typer\n"})
    assert terminal_imports(src) == ["trainwise/plan/commands.py:1 imports typer; only cli/ knows the terminal"]


# ---- inside a room: no file-level circles, one definition per name, one owner per contract constant -----------
CONTRACT_CONSTANTS = ("IGNORE_INDEX",)  # the batch contract's names, defined once (config/labels.py) and imported


def _modules(src: Path = SRC) -> dict[str, Path]:
    return {_module_name(path, src): path for path in sorted((src / "trainwise").rglob("*.py"))}


def file_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the modules of its own room it imports (`from trainwise.room import module` counts too)."""
    modules = _modules(src)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        room = _room(module)
        for target, names, _ in _imports(path, src):
            for candidate in (target, *(f"{target}.{name}" for name in names)):
                if candidate in modules and candidate != module and _room(candidate) == room \
                        and candidate.count(".") >= 2 and module.count(".") >= 2:
                    graph.setdefault(module, set()).add(candidate)
    return graph


def file_circles(src: Path = SRC) -> list[list[str]]:
    """The groups of modules inside one room that import each other round in a circle (strongly connected
    components of more than one module; TYPE_CHECKING and lazy imports count, as above)."""
    graph, index, low, stack, on_stack, found = file_graph(src), {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                on_stack.discard(member)
                group.append(member)
            on_stack.discard(node)
            if group:
                found.append(sorted([node, *group]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def duplicate_definitions(src: Path = SRC) -> list[str]:
    """Top-level functions, classes and constants defined twice in one module (the later one shadows)."""
    found = []
    for module, path in _modules(src).items():
        seen: dict[str, int] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.col_offset == 0:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
            else:
                continue
            for name in names:
                if name in seen:
                    found.append(f"{path.relative_to(src)}:{node.lineno} defines {name} again "
                                 f"(first at line {seen[name]})")
                seen.setdefault(name, node.lineno)
    return found


def contract_redefinitions(src: Path = SRC) -> list[str]:
    """Modules that assign a contract constant themselves instead of importing the one definition."""
    where: dict[str, list[str]] = {}
    for module, path in _modules(src).items():
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id in CONTRACT_CONSTANTS:
                    where.setdefault(target.id, []).append(f"{path.relative_to(src)}:{node.lineno}")
    return [f"{name} is defined in {len(places)} modules ({', '.join(places)}); define it once and import it"
            for name, places in sorted(where.items()) if len(places) > 1]


def test_no_module_defines_a_name_twice():
    assert duplicate_definitions() == []


def test_no_file_level_circles():
    assert file_circles() == []


def test_contract_constants_are_defined_once():
    assert contract_redefinitions() == []


def test_the_checkers_see_a_file_circle_a_shadowed_definition_and_a_second_constant(tmp_path):
    src = _fake_tree(tmp_path, {"data/a.py": "from trainwise.data import b\nIGNORE_INDEX = -100\n",
                                "data/b.py": "def f():\n    from trainwise.data.a import g\n",
                                "data/c.py": "IGNORE_INDEX = -100\ndef h():\n    pass\ndef h():\n    pass\n"})
    assert file_circles(src) == [["trainwise.data.a", "trainwise.data.b"]]
    assert duplicate_definitions(src) == ["trainwise/data/c.py:4 defines h again (first at line 2)"]
    [problem] = contract_redefinitions(src)
    assert "IGNORE_INDEX is defined in 2 modules" in problem
