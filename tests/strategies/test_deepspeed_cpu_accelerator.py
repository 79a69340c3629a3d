"""On a CPU-only run DeepSpeed is pointed at its CPU accelerator without the user setting DS_ACCELERATOR."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("deepspeed")

PROBE = """
import os, sys
from accelerando.plugins.deepspeed import import_deepspeed
print("before", os.environ.get("DS_ACCELERATOR"))
ds = import_deepspeed()
from deepspeed.accelerator import get_accelerator
print("after", os.environ.get("DS_ACCELERATOR"), get_accelerator().device_name())
"""


def _start(env_extra: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env.update(env_extra, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    return subprocess.Popen(
        [sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _lines(probe: subprocess.Popen[str]) -> list[str]:
    try:
        stdout, stderr = probe.communicate(timeout=300)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    assert probe.returncode == 0, stderr[-3000:]
    return [line for line in stdout.splitlines() if line.startswith(("before", "after"))]


@pytest.fixture(scope="module")
def probes() -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Both probes start at once (each is one process importing DeepSpeed, mostly on one core)."""
    started = {"unset": _start({}), "user": _start({"DS_ACCELERATOR": "cpu"})}
    yield started
    for probe in started.values():
        if probe.poll() is None:
            probe.kill()
            probe.wait()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only machine's default")
def test_cpu_run_gets_the_deepspeed_cpu_accelerator(probes) -> None:
    assert _lines(probes["unset"]) == ["before None", "after cpu cpu"]


def test_a_user_choice_is_kept(probes) -> None:
    lines = _lines(probes["user"])
    assert lines[-1].startswith("after cpu")
