"""A run directory made elsewhere runs none of the code its config names until the user says --trust-code;
the standard library is never a factory; the user's own runs need no flag."""
import json
import os

import pytest

from tests.conftest import invoke, tiny_config
from trainwise.errors import RunDirError
from trainwise.rundir.layout import RunDir
from trainwise.rundir.trust import foreign_because, require_trust

FACTORY = {"name": None, "factory": "tests.e2e.user_data:tiny_model", "args": {}}


def _run_with_factory(tmp_path, host=None):
    run = RunDir.create(tmp_path / "run")
    run.write_config(tiny_config(model=FACTORY))
    if host:
        run.lock_path.write_text(json.dumps({"pid": 1, "host": host, "since": 0}))
    return run


def test_a_run_written_on_another_machine_asks_for_trust_first(tmp_path):
    run = _run_with_factory(tmp_path, host="someone-elses-server")
    assert "another machine (someone-elses-server" in foreign_because(run)
    with pytest.raises(RunDirError, match="--trust-code") as refused:
        require_trust(run, run.read_config(), trust_code=False, command="eval")
    assert "model.factory: tests.e2e.user_data:tiny_model" in str(refused.value)
    require_trust(run, run.read_config(), trust_code=True, command="eval")  # the user said so


def test_own_runs_and_built_in_models_need_no_flag(tmp_path):
    run = _run_with_factory(tmp_path)
    assert foreign_because(run) is None
    require_trust(run, run.read_config(), trust_code=False, command="eval")
    builtin = RunDir.create(tmp_path / "builtin")
    builtin.write_config(tiny_config())
    builtin.lock_path.write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": 0}))
    require_trust(builtin, builtin.read_config(), trust_code=False, command="eval")  # names no code


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_a_run_owned_by_another_user_asks_for_trust(tmp_path):
    run = _run_with_factory(tmp_path)
    os.chown(run.config_path, 12345, -1)
    assert "another user (uid 12345" in foreign_because(run)


def test_eval_and_resume_of_a_foreign_run_exit_2_before_running_anything(tmp_path, capsys):
    run = _run_with_factory(tmp_path, host="someone-elses-server")
    for command in ("eval", "resume"):
        result = invoke(capsys, command, str(run.path))
        assert result.returncode == 2 and "--trust-code" in result.stderr and "Traceback" not in result.stderr
    assert json.loads(run.lock_path.read_text())["host"] == "someone-elses-server"  # resume took no lock
