"""The bundled check scripts stand at the reference's paths and exit as the reference's do (issue 40 item 3).

A user's suite runs ``accelerate launch <path_in_accelerate_package("test_utils", "scripts", X)>``
or ``torchrun ... X``: each of the reference's script file names must exist here, and each of ours
must pass where the reference's passes. Every script (ours and the reference's) is run in 1 process
(``python X``) and in 2 (``torchrun --standalone --nproc_per_node 2 X``; ``test_notebook.py``
starts its own processes from ``ACCELERATE_NUM_PROCESSES``), on CPU with gloo, and the exit statuses
are compared. Where the reference's script cannot pass on CPU (it assumes GPUs), ``REFERENCE_FAILS_ON_CPU``
says why: ours passes there, and the test checks that the reference still fails (so the list stays true).

The name check runs by default; the runs are slow (about 32 launches, several minutes on 2 cores):
``python -m pytest -q -m slow tests/test_utils_pkg/test_scripts_vs_reference.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import accelerando

accelerate = pytest.importorskip("accelerate")

OURS = Path(accelerando.__file__).parent / "test_utils" / "scripts"
REFERENCE = Path(accelerate.__file__).parent / "test_utils" / "scripts"

SCRIPTS = (
    "test_cli.py",
    "test_ddp_comm_hook.py",
    "test_distributed_data_loop.py",
    "test_merge_weights.py",
    "test_notebook.py",
    "test_ops.py",
    "test_script.py",
    "test_sync.py",
)

# Script file names of the reference we do not ship, with the reason (none today).
DELIBERATE_GAPS: dict[str, str] = {}

# (script, processes) where the reference's own script exits non-zero on CPU, and why; ours passes.
REFERENCE_FAILS_ON_CPU: dict[tuple[str, int], str] = {
    ("test_ddp_comm_hook.py", 1): "it builds DDP without a process group in one process",
    ("test_ddp_comm_hook.py", 2): "it passes device_ids=[rank] to DDP, which CPU modules refuse",
    ("test_distributed_data_loop.py", 1): "it asserts two processes ('expects that two GPUs are available')",
    ("test_distributed_data_loop.py", 2): (
        "its torchrun on CPU runs two one-process jobs (see deliberate_differences), so it sees 1 process"
    ),
    ("test_notebook.py", 1): (
        "its monitoring check expects a launched process's failure to be caught, but one process runs in place"
    ),
}


def _names(folder: Path) -> set[str]:
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*.py")
        if "__pycache__" not in p.parts and p.name != "__init__.py"
    }


def test_script_names_match_the_reference():
    missing = _names(REFERENCE) - _names(OURS) - set(DELIBERATE_GAPS)
    extra = _names(OURS) - _names(REFERENCE)
    assert not missing, f"scripts of the reference missing here: {sorted(missing)}"
    assert set(SCRIPTS) == {n for n in _names(REFERENCE) if "/" not in n}
    # Ours may have more (none today); the external_deps folder is the reference's too.
    assert not extra, f"scripts here the reference lacks: {sorted(extra)}"
    assert (OURS / "external_deps" / "__init__.py").is_file()


def _environment(processes: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", ACCELERATE_NUM_PROCESSES=str(processes))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _run(script: Path, processes: int) -> subprocess.CompletedProcess[str]:
    if processes == 1 or script.name == "test_notebook.py":
        command = [sys.executable, str(script)]
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command = [*torchrun, "--nproc_per_node", str(processes), str(script)]
    return subprocess.run(
        command, env=_environment(processes), capture_output=True, text=True, timeout=600, cwd=script.parent
    )


def _tail(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout + result.stderr)[-3000:]


def test_cli_script_exits_as_the_reference_in_one_process():
    ours, reference = _run(OURS / "test_cli.py", 1), _run(REFERENCE / "test_cli.py", 1)
    assert ours.returncode == reference.returncode == 0, _tail(ours) + _tail(reference)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_exits_as_the_reference(name: str, processes: int):
    ours = _run(OURS / name, processes)
    assert ours.returncode == 0, f"ours failed ({ours.returncode}):\n{_tail(ours)}"
    reference = _run(REFERENCE / name, processes)
    if (name, processes) in REFERENCE_FAILS_ON_CPU:
        assert reference.returncode != 0, (
            f"the reference now passes {name} on {processes} process(es): remove it from REFERENCE_FAILS_ON_CPU"
        )
    else:
        assert reference.returncode == 0, f"reference failed ({reference.returncode}):\n{_tail(reference)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in _names(REFERENCE) if n.startswith("external_deps/")))
def test_external_deps_script_never_passes_without_checking(name: str):
    """Ours check nothing (not provided): each exits 1 with one line saying why, never a pass it did not earn."""
    ours = _run(OURS / name, 1)
    assert ours.returncode == 1, _tail(ours)
    assert f"{Path(name).name}: not run: " in ours.stderr, ours.stderr
