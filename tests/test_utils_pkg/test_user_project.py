"""A user's test suite written against the reference's test_utils passes on accelerando.

user_project/ holds a test module and a 2-process training script written with ``accelerate``
imports. The test copies them and runs the suite with pytest in a subprocess, switched to accelerando
in one of the two ways a user can:

* ``textual``: the package name is replaced by ``accelerando`` in the sources;
* ``stand_in``: the sources stay as they are and a conftest calls
  ``accelerando.install_as_accelerate()`` (launches then add ``--install_as_accelerate``).

It checks that the suite passed, that the hardware/slow decorators skipped what they should, that
both launched processes ran accelerando's ``Accelerator``, and that the real ``accelerate`` package
(installed here too) was never imported by the suite.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Each variant launches `accelerando launch` twice (2 processes, then 1): about a minute on a shared CPU.
pytestmark = pytest.mark.slow

PROJECT = Path(__file__).with_name("user_project")

_RECORDER = """
import json, sys

def pytest_sessionfinish(session, exitstatus):
    # Modules named accelerate* whose code is the real package's (the stand-in's resolve to accelerando).
    real = sorted(
        name for name, module in sys.modules.items()
        if name.split(".")[0] == "accelerate"
        and "accelerando" not in str(getattr(module, "__file__", None) or getattr(module, "__path__", ""))
    )
    with open("modules.json", "w") as handle:
        json.dump({"real_accelerate": real, "accelerando": "accelerando" in sys.modules}, handle)
"""

_STAND_IN = "import accelerando\n\naccelerando.install_as_accelerate()\n"


def _switch(source: str) -> str:
    return re.sub(r"\baccelerate\b", "accelerando", source)


@pytest.mark.parametrize("switch", ["textual", "stand_in"])
def test_reference_style_suite_passes_on_accelerando(tmp_path, switch):
    for path in PROJECT.glob("*.py"):
        name = "test_user_suite.py" if path.name == "user_suite.py" else path.name
        source = path.read_text()
        if switch == "textual":
            source = _switch(source)
            assert not re.search(r"^\s*(from|import) accelerate\b", source, re.M)
        (tmp_path / name).write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text((_STAND_IN if switch == "stand_in" else "") + _RECORDER)
    env = {k: v for k, v in os.environ.items() if k != "RUN_SLOW" and not k.startswith("PYTEST_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-rs", "-p", "no:cacheprovider", "test_user_suite.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert re.search(r"\b5 passed, 4 skipped\b", report), report
    for rank in (0, 1):
        assert f"USER SCRIPT OK rank {rank} accelerator from accelerando.accelerator" in report, report
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert modules == {"real_accelerate": [], "accelerando": True}
