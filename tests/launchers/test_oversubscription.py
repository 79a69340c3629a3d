"""More CPU processes than usable cores: the launch says so once, with both numbers and the fix, first.

Plans are built without starting anything; the launch command's own path is run with its process
starter replaced, so what is printed before the processes would start is checked without timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.commands import launch
from accelerando.core.settings import Sourced, resolve
from accelerando.core.settings.machine import MachineInfo, detect_machine
from accelerando.launchers.plan import Command, build

TRAIN = Command("train.py")


@pytest.fixture(autouse=True)
def clean_env(isolated_env: None) -> None:
    """No settings variable from the machine (see the root conftest)."""


def _warnings(machine: MachineInfo, **values: object) -> list[str]:
    settings = resolve([{k: Sourced(v, f"cli:--{k}") for k, v in values.items()}], warn_sources=())
    plan = build(settings, TRAIN, machine, port=lambda: 12345)
    return [note for note in plan.notes if "oversubscribe" in note]


def test_more_cpu_processes_than_cores_warns_once_with_the_numbers_and_the_fix() -> None:
    [warning] = _warnings(MachineInfo(gpu_count=0, cpu_count=2, python="py"), cpu=True, num_processes=8)
    assert warning.startswith("warning: 8 CPU processes on the 2 CPU core(s)")
    assert "slower" in warning
    assert "--num_processes 2" in warning and "OMP_NUM_THREADS=1" in warning


@pytest.mark.parametrize("processes", [1, 2])
def test_no_warning_while_every_process_has_a_core(processes: int) -> None:
    assert (
        _warnings(MachineInfo(gpu_count=0, cpu_count=2, python="py"), cpu=True, num_processes=processes) == []
    )


def test_a_machine_without_gpus_counts_as_cpu_even_without_the_flag() -> None:
    assert len(_warnings(MachineInfo(gpu_count=0, cpu_count=2, python="py"), num_processes=3)) == 1


def test_gpu_processes_are_not_counted_against_cores() -> None:
    gpu_box = MachineInfo(gpu_count=8, cpu_count=4, python="py")
    assert _warnings(gpu_box, num_processes=8) == []
    assert len(_warnings(gpu_box, cpu=True, num_processes=8)) == 1  # --cpu: they run on the cores


def test_the_suggested_count_covers_every_machine() -> None:
    machine = MachineInfo(gpu_count=0, cpu_count=2, python="py")
    [warning] = _warnings(
        machine, cpu=True, num_processes=16, num_machines=2, machine_rank=0, main_process_ip="127.0.0.1"
    )
    assert warning.startswith("warning: 8 CPU processes on the 2 CPU core(s)")  # per machine
    assert "--num_processes 4 " in warning  # 2 cores x 2 machines


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_the_core_count_is_the_affinity_mask_not_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert detect_machine().cpu_count == 1


def test_the_launch_prints_the_warning_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import accelerando.launchers.runner as runner
    from accelerando.core.settings import machine as machine_module

    started = []
    monkeypatch.setattr(
        machine_module, "detect_machine", lambda: MachineInfo(gpu_count=0, cpu_count=2, python=sys.executable)
    )
    monkeypatch.setattr(
        runner,
        "run",
        lambda plan, quiet=False, replace_process=False: started.append(capsys.readouterr().err) or 0,
    )
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    assert launch.main(["--cpu", "--num_processes", "8", str(script)]) == 0
    [printed] = started  # what was on stderr when the processes would have started
    lines = [line for line in printed.splitlines() if "oversubscribe" in line]
    assert len(lines) == 1 and lines[0].startswith("accelerando launch: warning: 8 CPU processes on the 2 ")


def test_dry_run_on_this_machine_names_its_own_core_count(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    argv = [sys.executable, "-m", "accelerando", "launch", "--cpu", "--num_processes", str(cores + 1)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    (tmp_path / "train.py").write_text("print('never run')\n")
    proc = subprocess.run(
        [*argv, "--dry_run", "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "oversubscribe" in line]
    assert len(lines) == 1, proc.stdout
    assert f"{cores + 1} CPU processes on the {cores} CPU core(s)" in lines[0]
