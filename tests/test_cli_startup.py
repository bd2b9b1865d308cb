"""The command line starts without importing torch for what never touches it: `trainwise --help` answers
in a fraction of a second instead of after torch's ~1.5 s import, and `report` reads a run without it (a
recommender's report excepted: its section scores users with the model)."""
import subprocess
import sys

from tests.conftest import ROOT

PROBE = """
import sys
from trainwise.cli import main
sys.argv = {argv!r}
try:
    main()
except SystemExit:
    pass
print("torch imported:", "torch" in sys.modules, file=sys.stderr)
"""


def _imports_torch(*argv: str) -> bool:
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=["trainwise", *argv])], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert "torch imported:" in done.stderr, done.stderr[-2000:]
    return "torch imported: True" in done.stderr


def test_help_does_not_import_torch():
    assert not _imports_torch("--help")
    assert not _imports_torch("train", "--help")
    assert _imports_torch("plan", "digits")  # the probe sees torch when a command does import it


def test_the_library_names_still_resolve_on_first_use():
    import trainwise  # the library's names still resolve, on first use

    assert trainwise.Trainer.__name__ == "Trainer" and "RunDir" in dir(trainwise)


def test_report_of_a_run_does_not_import_torch_or_the_data_builders(tmp_path):
    from tests.conftest import tiny_config
    from trainwise.launch.runs import train_run

    run = train_run(tiny_config(train={"max_steps": 4}, telemetry={"enabled": False}), tmp_path / "run")
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=["trainwise", "report", str(run.path)]) +
                           "print('sklearn imported:', 'sklearn' in sys.modules, file=sys.stderr)"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "torch imported: False" in done.stderr and "sklearn imported: False" in done.stderr, done.stderr[-2000:]
    assert (run.path / "report.html").is_file()
