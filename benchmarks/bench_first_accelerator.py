"""CPU time of the first Accelerator: ``from X import Accelerator; Accelerator()`` after ``import torch``.

Each round starts one fresh interpreter per package (accelerando, then the reference ``accelerate``,
interleaved so that machine load hits both alike). The child imports torch first, then measures with
``time.process_time`` (CPU time of the process, so other load on the machine does not count):
the import of ``Accelerator`` and the construction of a default ``Accelerator()``. Prints the medians,
the ratio accelerando / reference, and the number of modules each package loaded.

A full (generation 2) garbage collection falls inside this window for both packages: after
``import torch`` the collector is a few hundred allocations away from one, and it walks every object
torch created (about 0.15 s CPU). Whoever allocates next pays it, so it is reported apart
(``full gc ms``) and the ratio is given with and without it.

    python benchmarks/bench_first_accelerator.py [rounds]      # default 9 rounds

Bytecode is warmed by one unmeasured round of each package first, as a user's second run would be.
The children write and read their bytecode under a private ``PYTHONPYCACHEPREFIX`` (a temporary
folder) and ``PYTHONDONTWRITEBYTECODE`` is dropped from their environment: with it set, every module
edited since its cached bytecode was written (on a shared working tree, often a few) is compiled
from source in every measured round, which a user's second run never does.

``compare_reference.py`` imports :func:`measure_first_accelerator` for its ``first`` figure.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import gc, json, sys, time
import torch
package = sys.argv[1]
full_collections = []
def _time_full_collections(phase, info):
    if info["generation"] == 2:
        full_collections.append(time.process_time() if phase == "start" else -time.process_time())
gc.callbacks.append(_time_full_collections)
before = set(sys.modules)
t0 = time.process_time()
Accelerator = __import__(package, fromlist=["Accelerator"]).Accelerator
t1 = time.process_time()
Accelerator()
t2 = time.process_time()
added = [name for name in set(sys.modules) - before if name.split(".")[0] == package]
gc_time = -sum(full_collections)
print(json.dumps({"import": t1 - t0, "construct": t2 - t1, "full_gc": gc_time, "modules": len(added)}))
"""

PACKAGES = ("accelerando", "accelerate")


def measure_first_accelerator(package: str) -> float:
    """CPU seconds of ``from <package> import Accelerator; Accelerator()`` in this process.

    Call it in a fresh interpreter after ``import torch`` (``compare_reference.py`` does).

    Args:
        package: ``"accelerando"`` or the reference's ``"accelerate"``.

    Returns:
        The process CPU time (``time.process_time``) the import and the construction took.

    Raises:
        ImportError: the package is not installed.
    """
    start = time.process_time()
    __import__(package, fromlist=["Accelerator"]).Accelerator()
    return time.process_time() - start


@functools.cache
def _bytecode_folder() -> str:
    return tempfile.mkdtemp(prefix="bench_first_accelerator_pyc_")


def _one_round(package: str) -> dict[str, float]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ACCELERATE_", "ACCELERANDO_")) and key != "PYTHONDONTWRITEBYTECODE"
    }
    env["PYTHONPYCACHEPREFIX"] = _bytecode_folder()
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, package], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main(rounds: int = 9) -> None:
    """Run ``rounds`` interleaved rounds and print the medians and ratios."""
    for package in PACKAGES:
        _one_round(package)  # warm the bytecode caches (the first compiles torch's too: slow)
    results: dict[str, list[dict[str, float]]] = {package: [] for package in PACKAGES}
    for _ in range(rounds):
        for package in PACKAGES:
            results[package].append(_one_round(package))
    for runs in results.values():
        for run in runs:
            run["total"] = run["import"] + run["construct"]
            run["total_without_gc"] = run["total"] - run["full_gc"]
    keys = ("import", "construct", "full_gc", "total", "total_without_gc", "modules")
    medians = {
        package: {key: statistics.median(r[key] for r in runs) for key in keys}
        for package, runs in results.items()
    }
    print(
        f"first Accelerator after import torch, CPU time, medians over {rounds} interleaved fresh processes"
    )
    print(
        f"{'package':<12} {'import ms':>10} {'construct ms':>13} {'total ms':>9} {'full gc ms':>11} "
        f"{'total-gc ms':>12} {'modules':>8}"
    )
    for package, m in medians.items():
        print(
            f"{package:<12} {m['import'] * 1e3:>10.1f} {m['construct'] * 1e3:>13.1f} {m['total'] * 1e3:>9.1f} "
            f"{m['full_gc'] * 1e3:>11.1f} {m['total_without_gc'] * 1e3:>12.1f} {int(m['modules']):>8}"
        )
    ours, reference = medians["accelerando"], medians["accelerate"]
    print(f"ratio accelerando / reference, total: {ours['total'] / reference['total']:.2f}")
    print(
        "ratio accelerando / reference, total without the full gc: "
        f"{ours['total_without_gc'] / reference['total_without_gc']:.2f}"
    )
    paired = {
        key: statistics.median(
            a[key] / b[key] for a, b in zip(results["accelerando"], results["accelerate"], strict=True)
        )
        for key in ("total", "total_without_gc")
    }
    print(
        f"paired ratios (median of per-round ratios): total {paired['total']:.2f}, "
        f"without the full gc {paired['total_without_gc']:.2f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
