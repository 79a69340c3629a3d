"""The work a launch does before the user's script runs, counted (modules imported, interpreters started).

A one-process launch from the command line becomes the script (``os.execvp``): one process, the
script's pid is the launcher's, and the launcher imports no torch and not the stand-in (with its
``importlib.metadata``); a two-process launch runs each process's shim in the script's own
interpreter (no extra Python start-up per process), and the shim imports only the standard library
(no accelerando package, no ``typing``, ``re`` or ``pkgutil``) before the script's first line.

The budget a user notices is wall time: a one-process launch within +0.15 s of ``python script.py``
(``python benchmarks/compare_reference.py --only launch``, issue 43). Standard-library modules a
training process imports anyway (json, typing, dataclasses, shutil, socket...) are no longer kept off
the launcher's path for milliseconds; torch (a second or more) is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The launcher runs as the console script does (``main()`` reads sys.argv); the modules it imported are
# written just before it execs the script (os.execvp is wrapped only to look).
LAUNCHER = """\
import os, sys
from accelerando.commands.cli import main
sys.argv = ["accelerando", "launch", "--num_processes", "1", sys.argv[1], sys.argv[2]]
real_execvp = os.execvp

def execvp(file, args):
    modules = sorted(sys.modules)  # before this probe's own json
    import json
    with open(os.path.join(sys.argv[-1], "launcher.json"), "w") as handle:
        json.dump({"modules": modules, "pid": os.getpid()}, handle)
    real_execvp(file, args)

os.execvp = execvp
sys.exit(main())
"""

# What the script sees at its first line: the modules already imported, and who started it.
PROBE = """\
import os, sys
first_line = sorted(sys.modules)
import json
rank = os.environ.get("RANK", "0")
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as handle:
    json.dump({"modules": first_line, "parent": os.getppid(), "pid": os.getpid()}, handle)
"""

# Needed only when asked for (--install_as_accelerate), or by the processes themselves: torch alone is
# seconds of start-up.
NOT_FOR_ONE_PROCESS = {
    "importlib.metadata",
    "torch",
    "accelerando.core.stand_in",
}
# accelerando modules a one-process launcher imports: 39 since issue 43 (33 before: the launch plan
# became a package of 7 modules by subject). The multi-process runner's preflight, watchdog and bound
# rendezvous, the --fault_tolerance and --ray launchers and the layout rules load only in their launch
# mode: at module level they made a one-process launch +0.38 s over python (budget +0.15 s). A new one
# on this path costs every launch its import time; raise with care.
LAUNCHER_MODULE_CEILING = 39
# The shim is started by path (``python -u .../launchers/_start.py``) and loads as the top-level module
# ``_child``: no accelerando package, so no ``typing`` (and its ``re``); it runs a script as runpy.run_path
# would, without the ``pkgutil`` (typing again) that run_path imports. Each was a third of the shim.
SHIM_MODULES: set[str] = set()
NOT_BEFORE_THE_FIRST_LINE = {"typing", "re", "pkgutil", "json", "traceback", "torch", "socket"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    return clean


def _script(tmp_path: Path) -> tuple[str, Path]:
    script, out = tmp_path / "probe.py", tmp_path / "out"
    script.write_text(PROBE)
    out.mkdir()
    return str(script), out


def test_one_process_launcher_becomes_the_script_and_imports_little(
    tmp_path: Path, env: dict[str, str]
) -> None:
    script, out = _script(tmp_path)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, script, str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, stderr
    before_exec = json.loads((out / "launcher.json").read_text())
    modules = set(before_exec["modules"])
    assert not modules & NOT_FOR_ONE_PROCESS, modules & NOT_FOR_ONE_PROCESS
    ours = sorted(m for m in modules if m.split(".")[0] == "accelerando")
    assert len(ours) <= LAUNCHER_MODULE_CEILING, ours
    # One process in all: the script runs in the launcher's own process (its pid), in a fresh
    # interpreter (no accelerando module, no shim), as with `python script.py`.
    seen = json.loads((out / "rank0.json").read_text())
    assert seen["pid"] == before_exec["pid"] == launcher.pid
    assert not {m for m in seen["modules"] if m.split(".")[0] == "accelerando"}


def test_one_process_launch_from_python_returns(tmp_path: Path, env: dict[str, str]) -> None:
    """A caller that passes argv (tests, ``launch_command``) gets the exit status back: no exec."""
    script, out = _script(tmp_path)
    code = (
        "import os, sys\n"
        "from accelerando.commands.cli import main\n"
        "status = main(['launch', '--num_processes', '1', *sys.argv[1:]])\n"
        "print('returned', status, os.getpid())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, script, str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    _, status, pid = done.stdout.split()
    assert status == "0"
    seen = json.loads((out / "rank0.json").read_text())
    assert seen["parent"] == int(pid)  # a child of the caller, which went on


def test_two_process_shim_runs_in_the_script_interpreter_and_imports_little(
    tmp_path: Path, env: dict[str, str]
) -> None:
    script, out = _script(tmp_path)
    cli = Path(sys.executable).with_name("accelerando")
    command = [str(cli)] if cli.is_file() else [sys.executable, "-m", "accelerando.commands.cli"]
    launcher = subprocess.Popen(
        [*command, "launch", "--cpu", "--num_processes", "2", script, str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, stderr
    for rank in (0, 1):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        # The elastic agent runs inside the launcher: each process is its direct child, and the shim
        # (accelerando.launchers._child) ran in the very interpreter that runs the script.
        assert seen["parent"] == launcher.pid
        ours = {m for m in seen["modules"] if m.split(".")[0] == "accelerando"}
        assert ours == SHIM_MODULES
        assert not set(seen["modules"]) & {*NOT_BEFORE_THE_FIRST_LINE, "importlib.metadata"}
        assert "_child" in seen["modules"]  # the shim did run in this interpreter
