"""`trainwise doctor` as a user runs it: on recorded machines, on this machine, and with bad input."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import invoke
from trainwise.cli import app
from trainwise.errors import ConfigError

FACTS = Path(__file__).resolve().parents[1] / "doctor" / "facts"


def doctor(*args):
    return CliRunner().invoke(app, ["doctor", *args])


def by_title(result):
    return {f["title"]: f for f in json.loads(result.stdout)}


def test_json_findings_for_a_recorded_h200():
    result = doctor("--facts", str(FACTS / "h200.json"), "--json")
    assert result.exit_code == 0, result.output
    findings = json.loads(result.stdout)
    assert all({"code", "severity", "title", "detail", "evidence", "fixes", "step"} == set(f) for f in findings)
    titles = by_title(result)
    assert titles["Driver vs CUDA"]["severity"] == "info" and titles["GPU 0 temperature"]["severity"] == "info"


def test_a_failing_machine_exits_1_and_prints_the_fix():
    result = doctor("--facts", str(FACTS / "t4_old_driver.json"))
    assert result.exit_code == 1
    out = " ".join(result.stdout.split())  # undo the table's line wrapping
    assert "driver too old" in out and "fix:" in out and "cuda-keyring" in out
    assert out.endswith("3 warn, 2 fail")


def test_temperature_thresholds_from_the_command_line():
    hot = str(FACTS / "two_gpu_hot.json")
    default, strict = by_title(doctor("--facts", hot, "--json")), by_title(
        doctor("--facts", hot, "--json", "--temperature-warn", "60"))
    assert default["GPU 0 temperature"]["severity"] == "info" and strict["GPU 0 temperature"]["severity"] == "warn"


@pytest.mark.slow
def test_doctor_on_this_machine_records_its_facts(tmp_path):
    record = tmp_path / "me.json"
    result = doctor("--json", "--data-dir", str(tmp_path / "data"), "--record", str(record))
    assert result.exit_code in (0, 1), result.output
    titles = list(by_title(result))
    assert {"Python environment", "PyTorch build", "GPU visibility", "Data disk", "Free space",
            "Shared memory"} <= set(titles)
    assert list(by_title(doctor("--json", "--facts", str(record)))) == titles


@pytest.mark.slow
def test_exit_codes_bad_input_2_failing_check_1(tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    done = invoke(capsys, "doctor", "--data-dir", str(a_file))  # cli.main, as `trainwise` runs it
    assert done.returncode == 2, done.stderr
    assert "must be a directory" in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    failing = invoke(capsys, "doctor", "--facts", str(FACTS / "t4_old_driver.json"))
    assert failing.returncode == 1 and "driver too old" in failing.stdout


def test_inverted_temperature_thresholds_are_a_user_error():
    result = doctor("--temperature-warn", "95", "--facts", str(FACTS / "h200.json"))
    assert isinstance(result.exception, ConfigError) and "must be below" in str(result.exception)


def test_missing_facts_file_is_a_user_error(tmp_path):
    result = doctor("--facts", str(tmp_path / "missing.json"))
    assert isinstance(result.exception, ConfigError) and "does not exist" in str(result.exception)


def test_the_header_says_whether_the_machine_is_this_one_or_a_recorded_one(tmp_path, monkeypatch):
    from trainwise.doctor import facts as facts_module
    from trainwise.doctor.facts import load_facts

    recorded = load_facts(FACTS / "this_machine_cpu.json")
    recorded.description = "Recorded by trainwise doctor: Debian 12, no NVIDIA GPU, driver -, torch 2.13.0+cpu"
    monkeypatch.setattr(facts_module, "collect_facts", lambda data_dir, **job: recorded)
    live = doctor("--data-dir", str(tmp_path))
    assert live.stdout.startswith("This machine: Debian 12, no NVIDIA GPU") and "Recorded by" not in live.stdout
    replayed = doctor("--facts", str(FACTS / "h200.json"))
    assert replayed.stdout.startswith(f"Facts from {FACTS / 'h200.json'}")


def test_a_data_dir_that_does_not_exist_is_a_warning_with_the_fix(tmp_path):
    from trainwise.doctor.checks import run_checks
    from trainwise.data.disk import probe_disk
    from trainwise.doctor.facts import load_facts

    facts = load_facts(FACTS / "this_machine_cpu.json")
    facts.disk = probe_disk(tmp_path / "typo" / "data")
    found = {f.title: f for f in run_checks(facts)}["Data directory"]
    assert found.severity == "warn" and f"{tmp_path / 'typo' / 'data'} does not exist" in found.detail
    assert f"mkdir -p {tmp_path / 'typo' / 'data'}" in found.fixes[0]
    facts.disk = probe_disk(tmp_path)
    assert "Data directory" not in {f.title for f in run_checks(facts)}


def test_one_dataloader_worker_is_singular():
    from trainwise.doctor.checks import run_checks
    from trainwise.doctor.facts import load_facts

    facts = load_facts(FACTS / "this_machine_cpu.json")
    facts.host.cpu_usable = facts.host.cpu_logical = 2
    cores = {f.title: f for f in run_checks(facts)}["CPU cores"]
    assert cores.evidence["suggested_workers"] == 1
    assert "1 DataLoader worker" in cores.detail and "1 DataLoader workers" not in cores.detail
