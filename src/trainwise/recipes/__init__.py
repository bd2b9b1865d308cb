"""Built-in recipes: YAML files beside this module, each opening with the command that runs it."""
from __future__ import annotations

import difflib
from pathlib import Path

from trainwise.config import RunConfig, load_config
from trainwise.errors import ConfigError
from trainwise.recipes.schemas import check_builders

RECIPE_DIR = Path(__file__).parent


def list_recipes() -> dict[str, str]:
    """Recipe name → its one-line description (the first comment line of the file)."""
    recipes = {}
    for path in sorted(RECIPE_DIR.glob("*.yaml")):
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        recipes[path.stem] = first.lstrip("# ").strip()
    return recipes


def resolve_recipe(name_or_path: str) -> Path:
    """A YAML file path, or the name of a built-in recipe."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():
        if not candidate.is_file():
            raise ConfigError(f"{candidate}: no such recipe file.")
        return candidate
    name = name_or_path.replace("_", "-")
    path = RECIPE_DIR / f"{name}.yaml"
    if path.is_file():
        return path
    names = list(list_recipes())
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown recipe {name_or_path!r}.{hint} Built-in recipes: {', '.join(names)}; "
                      "or give the path to a YAML file.")


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> RunConfig:
    """The recipe with overrides applied, validated, including the built-in model's and data's arguments."""
    path = resolve_recipe(name_or_path)
    config = load_config(path, overrides)
    check_builders(config, source=str(path), overrides=overrides or [])
    return config
