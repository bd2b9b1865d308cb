"""`trainwise doctor --nproc N` and the doctor inside a launched job: ranks against visible GPUs, the NCCL
variables that break or slow jobs, InfiniBand, /dev/shm for every rank's workers. Judged on recorded facts
(a misconfigured SLURM job on an H200 machine) changed one field at a time; no GPU needed."""
import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainwise.cli import app
from trainwise.doctor.checks import run_checks
from trainwise.doctor.distributed import SHM_PER_WORKER_BYTES, matching_interfaces
from trainwise.doctor.distributed_facts import DistributedFacts, probe_distributed
from trainwise.doctor.facts import facts_from_dict, facts_to_dict, load_facts

FACTS = Path(__file__).parent / "facts"
MISCONFIGURED = FACTS / "h200_slurm_job_misconfigured.json"


def machine(name="h200_slurm_job_misconfigured"):
    return load_facts(FACTS / f"{name}.json")


def by_code(facts):
    return {f.code: f for f in run_checks(facts)}


def job(facts, **fields):
    return dataclasses.replace(facts, distributed=dataclasses.replace(facts.distributed, **fields))


def change(facts, part, **fields):
    return dataclasses.replace(facts, **{part: dataclasses.replace(getattr(facts, part), **fields)})


def healthy(facts):
    """The same job with every mistake undone: all GPUs visible, no stray NCCL variables, a big /dev/shm."""
    facts = change(facts, "host", cuda_visible_devices=None, shm_total_bytes=64 * 2**30, shm_free_bytes=64 * 2**30)
    facts = change(facts, "torch", device_count=2)
    return job(facts, env={"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth"})


def test_the_misconfigured_slurm_job_gets_every_problem_named_with_its_fix():
    found = by_code(machine())
    ranks = found["ranks_and_gpus"]
    assert ranks.severity == "error" and "invalid device ordinal" in ranks.detail
    assert "--gpus-per-node=2" in ranks.fixes[0]
    socket = found["nccl_socket_ifname"]
    assert socket.severity == "error" and "ib0 matches no network interface" in socket.detail
    assert socket.fixes[0].startswith("export NCCL_SOCKET_IFNAME=eth0")  # not lo, not docker0
    p2p = found["nccl_p2p_disabled"]
    assert p2p.severity == "warn" and "unset NCCL_P2P_DISABLE" in p2p.fixes[0]
    ib = found["infiniband"]
    assert ib.severity == "warn" and "mlx5_0" in ib.detail and ib.fixes == ("unset NCCL_IB_DISABLE",)
    assert "NCCL_DEBUG=WARN" in found["nccl_environment"].fixes[0]
    shm = found["shared_memory_for_ranks"]
    assert shm.severity == "warn" and "Bus error" in shm.detail and "--shm-size=" in shm.fixes[0]
    assert shm.evidence["needed_bytes"] == 2 * shm.evidence["workers_per_rank"] * SHM_PER_WORKER_BYTES


def test_the_same_job_set_up_right_is_all_clear():
    found = by_code(healthy(machine()))
    for code in ("ranks_and_gpus", "nccl_socket_ifname", "infiniband", "nccl_environment", "shared_memory_for_ranks"):
        assert found[code].severity == "info", (code, found[code].detail)
    assert "nccl_p2p_disabled" not in found
    assert "eth0" in found["nccl_socket_ifname"].detail and "active: mlx5_0/1" in found["infiniband"].detail


@pytest.mark.parametrize("gpus, nproc, severity, words", [
    (1, 4, "error", "only 1 GPU"), (8, 8, "info", "one per visible GPU"), (8, 2, "info", "2 of the 8")])
def test_ranks_against_the_gpus_torch_sees(gpus, nproc, severity, words):
    facts = job(change(change(machine(), "torch", device_count=gpus), "host", cuda_visible_devices=None),
                nproc=nproc, in_job=False)
    found = by_code(facts)["ranks_and_gpus"]
    assert found.severity == severity and words in found.detail
    if severity == "error":
        assert "--nproc 1" in found.fixes[0] and "--gpus all" in found.fixes[0]  # one card in the machine


def test_a_cpu_machine_runs_gloo_ranks_and_warns_past_its_cores():
    cpu = machine("this_machine_cpu")
    cores = cpu.host.cpu_usable
    ok = by_code(dataclasses.replace(cpu, distributed=DistributedFacts(nproc=cores)))
    assert ok["ranks_and_gpus"].severity == "info" and "gloo" in ok["ranks_and_gpus"].detail
    assert "nccl_environment" not in ok  # NCCL plays no part without GPUs
    too_many = by_code(dataclasses.replace(cpu, distributed=DistributedFacts(nproc=cores + 2)))["ranks_and_gpus"]
    assert too_many.severity == "warn" and f"--nproc {cores}" in too_many.fixes[0]


def test_gloo_socket_interface_is_checked_on_the_cpu_too():
    cpu = machine("this_machine_cpu")
    facts = dataclasses.replace(cpu, distributed=DistributedFacts(
        nproc=1, env={"GLOO_SOCKET_IFNAME": "enp9s0"}, interfaces=["eth0", "lo"]))
    found = by_code(facts)["gloo_socket_ifname"]
    assert found.severity == "error" and "GLOO_SOCKET_IFNAME=eth0" in found.fixes[0]
    prefix = dataclasses.replace(facts, distributed=dataclasses.replace(facts.distributed,
                                                                        env={"GLOO_SOCKET_IFNAME": "eth"}))
    assert by_code(prefix)["gloo_socket_ifname"].severity == "error"  # Gloo wants the exact name


@pytest.mark.parametrize("spec, selected", [
    ("eth", ["eth0", "eth1"]), ("=eth0", ["eth0"]), ("^docker,lo", ["eth0", "eth1", "ib0"]), ("ib9", []),
    ("^=eth0", ["docker0", "eth1", "ib0", "lo"]), ("eth0,ib", ["eth0", "ib0"])])
def test_socket_ifname_follows_ncclss_matching_rules(spec, selected):
    assert matching_interfaces(spec, ["docker0", "eth0", "eth1", "ib0", "lo"]) == selected


def test_infiniband_is_judged_only_between_machines():
    one_machine = by_code(job(machine(), nnodes=1))
    assert "infiniband" not in one_machine
    no_ib = by_code(job(healthy(machine()), infiniband_ports={}))["infiniband"]
    assert no_ib.severity == "info" and "TCP sockets" in no_ib.detail
    down = by_code(job(healthy(machine()), infiniband_ports={"mlx5_0/1": "1: DOWN"}))["infiniband"]
    assert down.severity == "warn" and "no port is ACTIVE" in down.detail and "ibstat" in down.fixes[0]


def test_shared_memory_counts_every_ranks_workers():
    facts = change(healthy(machine()), "host", shm_free_bytes=10 * SHM_PER_WORKER_BYTES)
    assert by_code(job(facts, nproc=2, num_workers=5))["shared_memory_for_ranks"].severity == "info"
    short = by_code(job(facts, nproc=2, num_workers=6))["shared_memory_for_ranks"]
    assert short.severity == "warn" and short.fixes[1] == "or use fewer workers per rank: data.num_workers=5"
    assert by_code(job(facts, num_workers=0))["shared_memory_for_ranks"].severity == "info"


def test_facts_with_a_job_round_trip_through_json_and_old_records_have_none():
    facts = machine()
    assert facts_from_dict(json.loads(json.dumps(facts_to_dict(facts)))) == facts
    assert machine("h200").distributed is None and "ranks_and_gpus" not in by_code(machine("h200"))


def test_the_probe_reads_the_launchers_environment(monkeypatch):
    for name in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    assert probe_distributed() is None  # no --nproc and not in a job: nothing to check
    asked = probe_distributed(nproc=4, num_workers=2)
    assert asked.nproc == 4 and asked.nnodes == 1 and not asked.in_job and asked.num_workers == 2
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    inside = probe_distributed()
    assert (inside.nproc, inside.nnodes, inside.rank, inside.world_size, inside.in_job) == (4, 2, 5, 8, True)
    assert inside.env["NCCL_IB_DISABLE"] == "1" and "lo" in inside.interfaces


def test_the_cli_checks_a_recorded_machine_for_n_ranks():
    runner = CliRunner()
    result = runner.invoke(app, ["doctor", "--facts", str(FACTS / "h200.json"), "--nproc", "2", "--json"])
    assert result.exit_code == 1, result.output  # two ranks, one GPU: a failure
    found = {f["code"]: f for f in json.loads(result.stdout)}
    assert found["ranks_and_gpus"]["severity"] == "error" and "only 1 GPU" in found["ranks_and_gpus"]["detail"]
    plain = runner.invoke(app, ["doctor", "--facts", str(FACTS / "h200.json"), "--json"])
    assert plain.exit_code == 0 and "ranks_and_gpus" not in {f["code"] for f in json.loads(plain.stdout)}
    shown = runner.invoke(app, ["doctor", "--facts", str(MISCONFIGURED)])
    assert "rank 1 of 4 in a launched job" in " ".join(shown.stdout.split()) and "Ranks and GPUs" in shown.stdout


@pytest.mark.slow
def test_inside_a_launched_job_the_doctor_checks_the_job_by_itself(tmp_path, capsys, monkeypatch, wide_terminal):
    from tests.conftest import invoke

    launched = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "LOCAL_RANK": "1",
                "GLOO_SOCKET_IFNAME": "no_such_if0"}  # what torchrun sets, plus a typo'd interface
    for name, value in launched.items():  # in this process's environment for the command, as a rank's
        monkeypatch.setenv(name, value)
    result = invoke(capsys, "doctor", "--json", "--data-dir", str(tmp_path))
    found = {f["code"]: f for f in json.loads(result.stdout)}
    assert found["ranks_and_gpus"]["evidence"]["nproc"] == 2 and found["ranks_and_gpus"]["evidence"]["nnodes"] == 2
    assert found["gloo_socket_ifname"]["severity"] == "error" and result.returncode == 1
