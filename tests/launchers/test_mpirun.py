"""Multi-CPU jobs through mpirun: the command line per MPI implementation, the checks, one real job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.core.settings import Sourced, resolve
from accelerando.core.settings.machine import MachineInfo
from accelerando.launchers.mpirun import MpiRun, detect_mpirun, flavour_of, mpirun_argv
from accelerando.launchers.plan import Command, build, check_files

CPU_BOX = MachineInfo(gpu_count=0, cpu_count=4, python="py", omp_threads_set=True)
OPEN_MPI = MpiRun("/usr/bin/mpirun", "openmpi")


def test_the_implementation_is_recognised_from_its_version_text() -> None:
    assert flavour_of("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/") == "openmpi"
    assert flavour_of("HYDRA build details:\n    Version: 4.0.2") == "mpich"
    assert flavour_of("Intel(R) MPI Library for Linux* OS, Version 2021.10") == "intelmpi"
    assert flavour_of("something else") is None


def test_options_per_implementation() -> None:
    argv = mpirun_argv(OPEN_MPI, "hosts", 4, 2, forward=["B", "A"], as_root=False)
    assert argv == [
        "/usr/bin/mpirun",
        "--hostfile",
        "hosts",
        "-np",
        "4",
        "--npernode",
        "2",
        "-x",
        "A",
        "-x",
        "B",
    ]
    assert "--allow-run-as-root" in mpirun_argv(OPEN_MPI, "hosts", 4, 2, as_root=True)
    hydra = mpirun_argv(MpiRun("mpirun", "mpich"), "hosts", 4, 2, forward=["A"], as_root=True)
    assert hydra == ["mpirun", "-f", "hosts", "-ppn", "2", "-n", "4"]


def test_missing_or_unknown_mpirun_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="mpirun is not on PATH. Fix: install"):
        detect_mpirun(which=lambda name: None)
    with pytest.raises(ValueError, match="does not know"):
        detect_mpirun(which=lambda name: "/x/mpirun", version=lambda path: "Some MPI 1.0")
    assert detect_mpirun(which=lambda n: "/x/mpirun", version=lambda p: "Open MPI 5").flavour == "openmpi"


def _settings(**values):
    return resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}])


def test_plan_of_an_mpirun_job(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    settings = _settings(cpu=True, num_processes=2, mpirun_hostfile=str(hosts), mpirun_ccl=3)
    plan = build(
        settings, Command("train.py", ("--lr", "1")), CPU_BOX, port=lambda: 23456, mpirun=lambda: OPEN_MPI
    )
    assert plan.mode == "mpirun" and not plan.uses_backend_runner
    assert plan.argv[:7] == ("/usr/bin/mpirun", "--hostfile", str(hosts), "-np", "2", "--npernode", "2")
    assert plan.argv[-4:] == ("py", "train.py", "--lr", "1")
    assert (plan.env["MASTER_ADDR"], plan.env["MASTER_PORT"], plan.env["CCL_WORKER_COUNT"]) == (
        "127.0.0.1",
        "23456",
        "3",
    )
    forwarded = {plan.argv[i + 1] for i, token in enumerate(plan.argv) if token == "-x"}
    assert set(plan.env) <= forwarded  # Open MPI passes only the named variables to other hosts


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"multi_gpu": True}, "multi-CPU job through mpirun, but GPUs"),
        ({"max_restarts": 1}, "mpirun cannot restart"),
        ({"rdzv_backend": "c10d"}, "rdzv_backend"),
    ],
)
def test_mpirun_refuses_what_it_cannot_do(tmp_path: Path, values: dict, message: str) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    base = {"num_processes": 2, "mpirun_hostfile": str(hosts), **values}
    machine = MachineInfo(gpu_count=2, cpu_count=4, python="py") if "multi_gpu" in values else CPU_BOX
    with pytest.raises(ValueError, match=message):
        build(_settings(**base), Command("t.py"), machine, mpirun=lambda: OPEN_MPI)


PROBE = """\
import json, os, sys
from accelerando.core.environments import detect_environment
env = detect_environment()
result = {"rank": env.rank, "world": env.world_size, "kind": env.name}
result["env"] = {k: v for k, v in os.environ.items() if k.startswith(("ACCELERATE", "MASTER", "CCL"))}
if sys.argv[2] == "group":  # the process group meets at the MASTER_ADDR/PORT the launcher exported
    import torch
    from accelerando.state import PartialState
    state = PartialState()
    total = torch.tensor([state.process_index + 1.0])
    torch.distributed.all_reduce(total)
    result.update(sum=total.item(), type=str(state.distributed_type))
with open(os.path.join(sys.argv[1], f"rank{env.rank}.json"), "w") as handle:
    json.dump(result, handle)
"""

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="mpirun is not installed (apt-get install openmpi-bin)"
)


def _mpirun_job(tmp_path: Path, mode: str) -> list[dict]:
    script, hosts = tmp_path / "probe.py", tmp_path / "hosts"
    script.write_text(PROBE)
    hosts.write_text("localhost slots=2\n")
    env = {**os.environ, "ACCELERANDO_CONFIG_FILE": os.devnull}
    argv = ["--cpu", "--num_processes", "2", "--mpirun-hostfile", str(hosts), "--mpirun_ccl", "1", "--debug"]
    done = subprocess.run(
        [sys.executable, "-m", "accelerando.commands.launch", *argv, str(script), str(tmp_path), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@needs_mpirun
def test_a_real_two_process_mpirun_job(tmp_path: Path) -> None:
    reports = _mpirun_job(tmp_path, "env")
    assert [(r["rank"], r["world"], r["kind"]) for r in reports] == [(0, 2, "mpi"), (1, 2, "mpi")]
    for report in reports:
        assert report["env"]["ACCELERATE_USE_CPU"] == "True"
        assert report["env"]["ACCELERATE_DEBUG_MODE"] == "true"
        assert report["env"]["CCL_WORKER_COUNT"] == "1"
        assert report["env"]["MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.slow
@needs_mpirun
def test_an_mpirun_job_forms_one_process_group(tmp_path: Path) -> None:
    reports = _mpirun_job(tmp_path, "group")
    assert {(r["sum"], r["type"]) for r in reports} == {(3.0, "MULTI_CPU")}


def test_a_missing_hostfile_is_refused_before_starting_not_when_planning() -> None:
    settings = _settings(num_processes=2, mpirun_hostfile="/no/such/hostfile")
    plan = build(settings, Command("t.py"), CPU_BOX, mpirun=lambda: OPEN_MPI)  # planned elsewhere: fine
    assert plan.mode == "mpirun"
    with pytest.raises(ValueError, match="is not a file"):
        check_files(settings)
