"""Counted work of the first Accelerator in a process: the accelerando modules it loads.

``from accelerando import Accelerator; Accelerator(cpu=True)`` after ``import torch`` is what every
script pays first; its CPU time is mostly importing and executing our modules (and building their
dataclasses), so the number of modules is the counted stand-in for it
(``python benchmarks/bench_first_accelerator.py`` gives the time, against the reference's).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from suite_support import ConcurrentProbes

SRC = Path(__file__).resolve().parents[2] / "src"

# 53 on 2026-12-02 (60 before: the kwargs handlers, ParallelismConfig, preemption, resume, precision
# advice and the availability checks (common.imports) load when used, and only the cluster environment that matches is imported; 58 when first
# written, 62 before that). The margin of 2 leaves room for a module split in two by a refactor, not
# for a new subsystem on the path.
MAX_MODULES = 55

# The dataclasses a default Accelerator builds: the reference's public configuration classes it
# constructs itself, and our internal records (settings, runtime, prepare requests...). Since issue 43
# the records are plain dataclasses again (core/records.py, which built them without generated code, is
# gone): 18 classes, about 8 ms of the first Accelerator's CPU time, which stays within 0.5x the
# reference's (python benchmarks/compare_reference.py --only first). The kwargs handlers and
# ParallelismConfig still load only when a script uses them.
PUBLIC_DATACLASSES_BUILT = {
    "DataLoaderConfiguration",
    "GradientAccumulationPlugin",
    "ProjectConfiguration",
    "TorchDynamoPlugin",
}
MAX_DATACLASSES_BUILT = 18

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
    "accelerando.plugins.kwargs",
    "accelerando.parallelism_config",
    "accelerando.facade.preemption",
    "accelerando.facade.resume",
    "accelerando.backends.precision.advice",
    "accelerando.common.imports",
    "accelerando.core.environments.mpi",
    "accelerando.core.environments.ray",
    "accelerando.core.environments.slurm",
    "accelerando.core.environments.torchrun",
)

CODE = """\
import json, sys
import torch
before = set(sys.modules)
from accelerando import Accelerator
Accelerator(cpu=True)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


@pytest.fixture(scope="module")
def probes(request: pytest.FixtureRequest) -> Iterator[ConcurrentProbes]:
    """The two fresh interpreters of this module, started together (each test checks its own)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)}
    commands = {
        "test_first_accelerator_loads_few_accelerando_modules": CODE,
        "test_first_accelerator_builds_few_dataclasses": DATACLASS_CODE,
    }
    running = ConcurrentProbes(
        request, {test: {"args": [sys.executable, "-c", code], "env": env} for test, code in commands.items()}
    )
    try:
        yield running
    finally:
        running.close()


def _last_line(probes: ConcurrentProbes, test: str) -> list[str]:
    done = probes.result(test, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_first_accelerator_loads_few_accelerando_modules(probes: ConcurrentProbes) -> None:
    added = _last_line(probes, "test_first_accelerator_loads_few_accelerando_modules")
    ours = [name for name in added if name.split(".")[0] == "accelerando"]
    assert len(ours) <= MAX_MODULES, f"{len(ours)} accelerando modules (ceiling {MAX_MODULES}): {ours}"
    loaded_optional = [
        name for name in ours if any(name == p or name.startswith(p + ".") for p in NOT_LOADED)
    ]
    assert not loaded_optional, loaded_optional


DATACLASS_CODE = """\
import dataclasses, json
import torch
built = []
process_class = dataclasses._process_class
def counting(cls, *args, **kwargs):
    built.append(cls.__qualname__)
    return process_class(cls, *args, **kwargs)
dataclasses._process_class = counting
from accelerando import Accelerator
Accelerator(cpu=True)
print(json.dumps(sorted(built)))
"""


def test_first_accelerator_builds_few_dataclasses(probes: ConcurrentProbes) -> None:
    built = _last_line(probes, "test_first_accelerator_builds_few_dataclasses")
    assert PUBLIC_DATACLASSES_BUILT <= set(built), PUBLIC_DATACLASSES_BUILT - set(built)
    assert len(built) <= MAX_DATACLASSES_BUILT, (len(built), built)
    # The kwargs handlers and ParallelismConfig are built only when a script uses them.
    assert not {"ParallelismConfig", "DistributedDataParallelKwargs", "GradScalerKwargs"} & set(built)
