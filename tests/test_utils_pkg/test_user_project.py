"""A user's test suite written against the reference's test_utils passes with accelerando swapped in.

user_project/ holds a test module and a 2-process training script written with ``accelerate``
imports. The test copies them, replaces the package name with ``accelerando`` (the switch a user makes),
runs the suite with pytest in a subprocess and checks that it passed, that the expected tests were
skipped by the hardware decorators, and that the real ``accelerate`` package (installed here too) was
never imported by the suite or by the launched processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The suite launches `accelerando launch` twice (2 processes, then 1): tens of seconds on a shared CPU.
pytestmark = pytest.mark.slow

PROJECT = Path(__file__).with_name("user_project")

_RECORDER = """
import json, sys

def pytest_sessionfinish(session, exitstatus):
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "accelerate")
    with open("modules.json", "w") as handle:
        json.dump({"accelerate": loaded, "accelerando": "accelerando" in sys.modules}, handle)
"""


def _switch(source: str) -> str:
    return re.sub(r"\baccelerate\b", "accelerando", source)


def test_reference_style_suite_passes_on_accelerando(tmp_path):
    for path in PROJECT.glob("*.py"):
        name = "test_user_suite.py" if path.name == "user_suite.py" else path.name
        switched = _switch(path.read_text())
        assert not re.search(r"^\s*(from|import) accelerate\b", switched, re.M)
        (tmp_path / name).write_text(switched)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(_RECORDER)
    env = {k: v for k, v in os.environ.items() if k != "RUN_SLOW" and not k.startswith("PYTEST_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_user_suite.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert re.search(r"\b6 passed, 4 skipped\b", report), report
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert modules == {"accelerate": [], "accelerando": True}
