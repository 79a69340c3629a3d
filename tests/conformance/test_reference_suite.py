"""The ratchet: every reference test listed in passing.txt still passes on accelerando.

Runs the reference's own test suite (accelerate 1.15.0's sdist tests) through
``../shared/conformance/run.sh candidate`` (the harness beside the repository) and fails naming each
listed test that no longer passes. About 10 minutes on 2 cores, so it is behind the ``conformance``
marker: ``python -m pytest -q -m conformance tests/conformance`` (CI runs it after the default suite).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from ratchet import listed_tests, passed_tests

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO.parent / "shared" / "conformance" / "run.sh"


def test_listed_reference_tests_still_pass(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not HARNESS.is_file():
        pytest.skip(f"the conformance harness is not beside the repository ({HARNESS})")
    listed = listed_tests()
    assert listed, "tests/conformance/passing.txt lists no test"
    results = Path(os.environ.get("CONFORMANCE_DIR") or tmp_path_factory.mktemp("conformance"))
    run = subprocess.run(
        ["bash", str(HARNESS), "candidate"],
        cwd=REPO,
        env={**os.environ, "CONFORMANCE_DIR": str(results)},
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    junit = results / "candidate" / "junit"
    assert junit.is_dir(), (
        f"the harness wrote no results (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    )
    lost = sorted(listed - passed_tests(junit))
    report = "\n".join(f"  {node}" for node in lost)
    assert not lost, (
        f"{len(lost)} of {len(listed)} reference tests that passed on accelerando no longer pass "
        f"(logs: {results}/candidate/logs):\n{report}"
    )
