"""Counted work of the first Accelerator in a process: the accelerando modules it loads.

``from accelerando import Accelerator; Accelerator(cpu=True)`` after ``import torch`` is what every
script pays first; its CPU time is mostly importing and executing our modules (and building their
dataclasses), so the number of modules is the counted stand-in for it
(``python benchmarks/bench_first_accelerator.py`` gives the time, against the reference's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# 58 when written (62 before: the connector no longer imports the pipeline and fault-tolerance plugin
# modules to ask whether one of their handlers was given, and the facade reaches common.operations /
# common.serialization on first use). The margin of 2 leaves room for a module split in two by a
# refactor, not for a new subsystem on the path.
MAX_MODULES = 60

# Loaded only when used: none of them is needed by a CPU Accelerator before prepare().
NOT_LOADED = (
    "accelerando.big_modeling",
    "accelerando.checkpointing",
    "accelerando.common.operations",
    "accelerando.common.serialization",
    "accelerando.data_loader",
    "accelerando.plugins.fault_tolerance",
    "accelerando.plugins.fp8_recipes",
    "accelerando.plugins.pipeline",
    "accelerando.backends.strategies.ddp",
    "accelerando.backends.trackers",
)

CODE = """\
import json, sys
import torch
before = set(sys.modules)
from accelerando import Accelerator
Accelerator(cpu=True)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _modules_loaded() -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_first_accelerator_loads_few_accelerando_modules() -> None:
    added = _modules_loaded()
    ours = [name for name in added if name.split(".")[0] == "accelerando"]
    assert len(ours) <= MAX_MODULES, f"{len(ours)} accelerando modules (ceiling {MAX_MODULES}): {ours}"
    loaded_optional = [name for name in ours if name.startswith(NOT_LOADED)]
    assert not loaded_optional, loaded_optional
