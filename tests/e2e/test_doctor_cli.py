"""`trainwise doctor` as a user runs it: on recorded machines, on this machine, and with bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

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
    assert all({"status", "title", "finding", "evidence", "fix"} == set(f) for f in findings)
    titles = by_title(result)
    assert titles["Driver vs CUDA"]["status"] == "ok" and titles["GPU 0 temperature"]["status"] == "ok"


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
    assert default["GPU 0 temperature"]["status"] == "ok" and strict["GPU 0 temperature"]["status"] == "warn"


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
def test_exit_codes_bad_input_2_failing_check_1(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    done = subprocess.run([sys.executable, "-m", "trainwise", "doctor", "--data-dir", str(a_file)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "must be a directory" in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    failing = subprocess.run([sys.executable, "-m", "trainwise", "doctor", "--facts", str(FACTS / "t4_old_driver.json")],
                             capture_output=True, text=True, timeout=120)
    assert failing.returncode == 1 and "driver too old" in failing.stdout


def test_inverted_temperature_thresholds_are_a_user_error():
    result = doctor("--temperature-warn", "95", "--facts", str(FACTS / "h200.json"))
    assert isinstance(result.exception, ConfigError) and "must be below" in str(result.exception)


def test_missing_facts_file_is_a_user_error(tmp_path):
    result = doctor("--facts", str(tmp_path / "missing.json"))
    assert isinstance(result.exception, ConfigError) and "does not exist" in str(result.exception)
