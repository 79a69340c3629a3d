"""The work a launch does before the user's script runs, counted (modules imported, interpreters started).

A one-process launch imports none of the multi-process machinery (rendezvous preflight and its
``socket``, the hang watchdog, the stand-in and its ``importlib.metadata``, torch); a two-process
launch runs each process's shim in the script's own interpreter (no extra Python start-up per
process), and the shim imports only the standard library and five small accelerando modules (two of
them package __init__ files) before
the script's first line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The launcher's modules are imported in the test's own interpreter, as the console script does.
LAUNCHER = """\
import json, sys
from accelerando.commands.cli import main
sys.argv = ["accelerando", "launch", "--num_processes", "1", sys.argv[1], sys.argv[2]]
try:
    main()
except SystemExit as exit:
    assert not exit.code, exit.code
print(json.dumps(sorted(sys.modules)))
"""

# What the script sees at its first line: the modules already imported, and who started it.
PROBE = """\
import json, os, sys
first_line = sorted(sys.modules)
rank = os.environ.get("RANK", "0")
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as handle:
    json.dump({"modules": first_line, "parent": os.getppid(), "pid": os.getpid()}, handle)
"""

# Needed only by a multi-process launch, or only when asked for (--install_as_accelerate).
NOT_FOR_ONE_PROCESS = {
    "socket",
    "importlib.metadata",
    "torch",
    "accelerando.launchers.preflight",
    "accelerando.launchers.watchdog",
    "accelerando.core.stand_in",
}
# accelerando modules a one-process launcher imports today (31: the settings table, the plan, the
# CLI; the --emit job writers load only with --emit). A new one on this path costs every launch its
# import time; raise with care.
LAUNCHER_MODULE_CEILING = 33
# The shim itself runs as ``__main__`` (``python -m accelerando.launchers._child``), so it is not listed.
SHIM_MODULES = {
    "accelerando",
    "accelerando.core",
    "accelerando.core._lazy",
    "accelerando.core.version",
    "accelerando.launchers",
}


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


def test_one_process_launcher_imports_no_multi_process_machinery(tmp_path: Path, env: dict[str, str]) -> None:
    script, out = _script(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, script, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert not modules & NOT_FOR_ONE_PROCESS, modules & NOT_FOR_ONE_PROCESS
    ours = sorted(m for m in modules if m.split(".")[0] == "accelerando")
    assert len(ours) <= LAUNCHER_MODULE_CEILING, ours
    # The script ran directly in its own interpreter (no shim), as with `python script.py`.
    seen = json.loads((out / "rank0.json").read_text())
    assert not {m for m in seen["modules"] if m.split(".")[0] == "accelerando"}


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
        assert not set(seen["modules"]) & {"torch", "importlib.metadata", "socket"}
