"""A launch without ``--emit`` loads none of the job writers; ``--emit`` still writes the job.

The job writers (``accelerando.launchers.emit``: the SLURM, Kubernetes and Ray renderers and the
shared job spec) are reached through the ``accelerando.launchers`` package's lazy attribute, so their
import cost (5 accelerando modules, dataclasses and regular expressions built at import) is paid
only by ``accelerando launch --emit``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCHER = """\
import json, sys
from accelerando.commands.cli import main
try:
    main(["launch", *sys.argv[1:]])  # argv given: the launch returns here (no exec into the script)
except SystemExit as exit:
    assert not exit.code, exit.code
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    return clean


def _launch(args: list[str], env: dict[str, str]) -> tuple[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    return done.stdout, json.loads(done.stderr.strip().splitlines()[-1])


def test_a_launch_without_emit_imports_no_job_writer(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    out, modules = _launch(["--cpu", "--num_processes", "1", str(script)], env)
    assert "the script ran" in out
    assert [m for m in modules if m.startswith("accelerando.launchers.emit")] == []


def test_emit_still_writes_the_job(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    out, modules = _launch(["--emit", "slurm", "--num_processes", "1", str(script)], env)
    assert out.startswith("#!/bin/bash") and "sbatch" in out
    assert "the script ran" not in out.replace(str(script), "")
    assert "accelerando.launchers.emit.slurm" in modules
