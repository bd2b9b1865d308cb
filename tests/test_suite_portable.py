"""The suite runs wherever trainwise is installed (a CI venv, conda on a GPU server): a test that starts
trainwise or Python in a subprocess uses the interpreter running the tests, `sys.executable -m trainwise`,
never a path into a virtual environment of the checkout (its `.venv` need not exist)."""
import re

from tests.conftest import ROOT

# a venv directory not preceded by a parent: relative to the working directory or to the checkout
RELATIVE_VENV = re.compile(r"(?<![\w/.-])\.venv[/\\]")
VENV = "." + "venv"  # spelled apart so that this file does not match itself


def relative_venv_paths(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if RELATIVE_VENV.search(line)]


def test_the_pattern_finds_paths_into_the_checkouts_venv_and_leaves_recorded_absolute_ones():
    assert relative_venv_paths(f'subprocess.run(["{VENV}/bin/python", "-m", "trainwise"])')
    assert relative_venv_paths(f"PY = ROOT / '{VENV}/bin/trainwise'")
    assert relative_venv_paths(f'"executable": "/home/user/{VENV}/bin/python"') == []  # a machine's recorded facts
    assert relative_venv_paths("[sys.executable, '-m', 'trainwise', 'train']") == []


def test_no_test_finds_trainwise_through_a_relative_venv_path():
    found = {str(path.relative_to(ROOT)): hits for path in sorted((ROOT / "tests").rglob("*.py"))
             if (hits := relative_venv_paths(path.read_text(encoding="utf-8")))}
    assert found == {}, f"use sys.executable (-m trainwise) instead: {found}"
