"""Issue 17 §3: a run directory from someone else runs none of their code. `report`, `diagnose` and `compare`
read it without rebuilding the model (no flag needed); `eval` and `resume` ask for --trust-code; and even with
it a factory in the standard library (`os:system`) is refused. A canary command shows nothing ever ran."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import invoke, tiny_config
from trainwise.launch.runs import train_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_run(tiny_config(), tmp_path_factory.mktemp("own") / "run").path


@pytest.fixture
def foreign(trained, tmp_path):
    """A copy of a run, as if made on another server, whose config was edited to run a shell command."""
    import shutil

    run = tmp_path / "foreign"
    shutil.copytree(trained, run)
    canary = tmp_path / "pwned"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"] = {"name": None, "factory": "os:system", "args": {"command": f"touch {canary}"}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / ".lock").write_text(json.dumps({"pid": 1, "host": "someone-elses-server", "since": 0}))
    return run, canary


def test_report_diagnose_and_compare_read_a_foreign_run_without_running_its_code(foreign, trained, capsys):
    run, canary = foreign
    reported = invoke(capsys, "report", str(run), "--format", "md")
    assert reported.returncode == 0, reported.stderr
    assert (run / "report.md").read_text().startswith("# Report")
    assert invoke(capsys, "diagnose", str(run), "--json").returncode == 0
    compared = invoke(capsys, "compare", str(run), str(trained), "--json")
    assert compared.returncode == 0, compared.stderr
    assert "model.factory" in compared.stdout  # the edit shows as a difference, read, never called
    assert not canary.exists()


def test_eval_asks_for_trust_and_with_it_still_refuses_the_standard_library(foreign, capsys):
    run, canary = foreign
    untrusted = invoke(capsys, "eval", str(run))
    assert untrusted.returncode == 2 and "--trust-code" in untrusted.stderr and "Traceback" not in untrusted.stderr
    trusted = invoke(capsys, "eval", str(run), "--trust-code")
    assert trusted.returncode == 2 and "Traceback" not in trusted.stderr
    assert "model.factory: 'os:system' names the Python standard library" in trusted.stderr
    resumed = invoke(capsys, "resume", str(run), "--trust-code")
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr
    assert not canary.exists()
