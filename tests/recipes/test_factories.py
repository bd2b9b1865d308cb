"""Building what a config names: a user's factory that fails is reported as theirs (one header line, then
their traceback), never as a trainwise crash; built-ins are checked against their schemas."""
import sys
import textwrap

import pytest
from torch import nn

from tests.conftest import tiny_config
from trainwise.data.bundle import DataSpec
from trainwise.errors import ConfigError, DataError, FactoryError, TrainingError
from trainwise.recipes import factories
from trainwise.recipes.factories import build_data, build_model, import_factory

SPEC = DataSpec(input_shape=(5,), num_classes=2)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write `mine_<n>.py` on sys.path and return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def write(source: str) -> str:
        name = f"mine_{len(names)}_{tmp_path.name.replace('-', '_')}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def _model_config(factory: str, **args):
    return tiny_config(model={"factory": factory, "args": args})


@pytest.mark.parametrize("raised", ["RuntimeError('boom')", "TypeError('boom')", "ValueError('boom')",
                                    "KeyError('boom')"])
def test_any_exception_from_a_users_model_factory_is_theirs(user_module, raised):
    name = user_module(f"""
        def helper(width):
            raise {raised}

        def build(data_spec, width=4):
            return helper(width)
        """)
    with pytest.raises(FactoryError) as caught:
        build_model(_model_config(f"{name}:build", width=7), SPEC)
    header, *rest = str(caught.value).splitlines()
    kind = raised.split("(")[0]
    assert header.startswith(f"model.factory {name}:build(width=7, data_spec=DataSpec(input_shape=(5,), "
                             f"num_classes=2)) raised {kind}: ")
    traceback = "\n".join(rest)
    assert traceback.startswith("Traceback (most recent call last):")
    assert "in build" in traceback and "in helper" in traceback  # their frames, in order
    assert "factories.py" not in traceback  # not ours
    assert isinstance(caught.value.__cause__, Exception)  # the original, for Python callers


def test_a_trainwise_error_from_a_users_factory_passes_unchanged(user_module):
    name = user_module("""
        from trainwise.errors import DataError

        def load(seed):
            raise DataError("/data/x: no manifest.json")
        """)
    with pytest.raises(DataError, match=r"^/data/x: no manifest.json$"):
        build_data(tiny_config(data={"factory": f"{name}:load"}))


def test_a_module_that_fails_while_importing_is_reported_with_its_traceback(user_module):
    name = user_module("""
        SETTINGS = {}
        WIDTH = SETTINGS["width"]
        """)
    with pytest.raises(FactoryError) as caught:
        import_factory(f"{name}:build", "model.factory")
    message = str(caught.value)
    assert message.startswith(f"model.factory: importing '{name}' raised KeyError: 'width'")
    assert 'WIDTH = SETTINGS["width"]' in message and "importlib" not in message


@pytest.mark.parametrize("reference, phrase", [
    # a run directory's config must not run the standard library: `os:system` would run a shell command
    ("builtins:dict", "names the Python standard library"),
    ("builtins:len", "names the Python standard library"),
    ("os:system", "names the Python standard library"),
    ("subprocess:run", "names the Python standard library"),
    ("tests.recipes.test_factories:reexported_system", "from the Python standard library"),
    ("tests.recipes.test_factories:SPEC", "is not callable"),
    ("os..path:join", "not of the form package.module:function"),
])
def test_builtins_and_odd_references_are_refused_clearly(reference, phrase):
    """None of them is called: the refusal comes before any code of theirs runs."""
    with pytest.raises(ConfigError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        build_model(_model_config(reference), SPEC)


def test_builtin_args_are_checked_at_build_even_when_the_config_skipped_validation():
    config = tiny_config()
    config.model.args["hidden"] = 7  # mutated in place: no pydantic validation ran
    with pytest.raises(ConfigError, match=r"model.args.hidden: expected a list of .*; got 7"):
        build_model(config, SPEC)


def test_a_builtin_model_too_large_to_allocate_is_a_training_error(monkeypatch):
    # torch's own words when a weight cannot be allocated; faked, as a real attempt could meet the OOM killer
    def huge(**kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 4398046511104 bytes.")

    monkeypatch.setitem(factories.BUILTIN_MODELS, "mlp", huge)
    with pytest.raises(TrainingError, match=r"model.args: huge\(hidden=\[8\], .*\) does not fit in this "
                                            "machine's memory"):
        build_model(tiny_config(model={"name": "mlp", "args": {"hidden": [8]}}), SPEC)


def test_any_other_error_of_a_builtin_is_a_bug_and_keeps_its_type(monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setitem(factories.BUILTIN_MODELS, "mlp", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        build_model(tiny_config(), SPEC)


def test_builtins_build_with_their_schema_defaults():
    config = tiny_config(model={"name": "mlp", "args": {}})
    assert isinstance(build_model(config, SPEC), nn.Module)


reexported_system = __import__("os").system  # a user module that re-exports the standard library's
