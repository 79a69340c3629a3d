"""On a CPU-only run DeepSpeed is pointed at its CPU accelerator without the user setting DS_ACCELERATOR."""

from __future__ import annotations

import os
import subprocess
import sys

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


def _run(env_extra: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env.update(env_extra, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.startswith(("before", "after"))]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only machine's default")
def test_cpu_run_gets_the_deepspeed_cpu_accelerator() -> None:
    assert _run({}) == ["before None", "after cpu cpu"]


def test_a_user_choice_is_kept() -> None:
    lines = _run({"DS_ACCELERATOR": "cpu"})
    assert lines[-1].startswith("after cpu")
