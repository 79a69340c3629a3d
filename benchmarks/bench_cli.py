"""Start-up cost of the ``accelerando`` command line.

Measures, as medians of interleaved runs on this machine:

1. ``accelerando --help`` wall time;
2. the time from starting the command to the first line of the user's script, for
   ``accelerando launch --num_processes 1 script.py`` against ``python script.py``;
3. the same with 2 CPU processes, ``accelerando launch --cpu --num_processes 2`` against ``torchrun``
   (time until the last of the 2 processes runs its first line).

Run: ``python benchmarks/bench_cli.py [--runs 7]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

FIRST_LINE = "import time, os, sys; open(sys.argv[1] + '/' + os.environ.get('RANK', '0'), 'w').write(repr(time.time()))\n"


def _exe(name: str, module: str) -> list[str]:
    # The console script next to this interpreter, not a version-manager shim that adds its own start-up.
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    return [found] if found else [sys.executable, "-m", module]


CPU: dict[str, list[float]] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _first_line_delay(command: list[str], out: Path, env: dict[str, str], label: str = "") -> float:
    for old in out.iterdir():
        old.unlink()
    cpu, start = _children_cpu(), time.time()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # CPU seconds of the whole process tree: robust to other load on a shared machine, unlike wall time.
    CPU.setdefault(label, []).append(_children_cpu() - cpu)
    return max(float(p.read_text()) for p in out.iterdir()) - start


def _wall(command: list[str], env: dict[str, str], label: str = "") -> float:
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    CPU.setdefault(label, []).append(_children_cpu() - cpu)
    return time.perf_counter() - start


def _interleave(runs: int, measures: dict[str, callable]) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in measures}
    names = list(measures)
    for i in range(runs):
        for name in names if i % 2 == 0 else reversed(names):
            samples[name].append(measures[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    """Run the three measurements and print their medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    cli = _exe("accelerando", "accelerando.commands.cli")
    torchrun = _exe("torchrun", "torch.distributed.run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    with tempfile.TemporaryDirectory() as tmp:
        env["XDG_CACHE_HOME"] = tmp  # no config file: defaults
        script, out = Path(tmp) / "first_line.py", Path(tmp) / "out"
        script.write_text(FIRST_LINE)
        out.mkdir()
        startup = _interleave(
            runs,
            {
                "help": lambda: _wall([*cli, "--help"], env, "help"),
                "python -c pass": lambda: _wall([sys.executable, "-c", "pass"], env, "bare"),
            },
        )
        one = _interleave(runs, {
            "python": lambda: _first_line_delay([sys.executable, str(script), str(out)], out, env, "py1"),
            "accelerando": lambda: _first_line_delay([*cli, "launch", "--num_processes", "1", str(script), str(out)], out, env, "acc1"),
        })  # fmt: skip
        two = _interleave(runs, {
            "torchrun": lambda: _first_line_delay([*torchrun, "--nproc_per_node", "2", "--master_port", "0",
                                                   str(script), str(out)], out, env, "torchrun2"),
            "accelerando": lambda: _first_line_delay([*cli, "launch", "--cpu", "--num_processes", "2",
                                                      str(script), str(out)], out, env, "acc2"),
        })  # fmt: skip
    cpu = {label: statistics.median(values) for label, values in CPU.items()}
    print(f"median of {runs} interleaved runs, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(
        f"accelerando --help: {startup['help']:.3f} s (python -c pass: {startup['python -c pass']:.3f} s)  (target <= 0.25 s)"
    )
    print(f"1 process, to first line: python {one['python']:.3f} s, accelerando launch {one['accelerando']:.3f} s"
          f" -> overhead {one['accelerando'] - one['python']:+.3f} s  (target <= 0.3 s)")  # fmt: skip
    print(f"2 processes, to first line: torchrun {two['torchrun']:.3f} s, accelerando launch "
          f"{two['accelerando']:.3f} s -> overhead {two['accelerando'] - two['torchrun']:+.3f} s  (target <= 0.2 s)")  # fmt: skip
    print("CPU seconds (user+sys, whole process tree): "
          + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items()))  # fmt: skip
    print(f"CPU overhead: --help {cpu['help'] - cpu['bare']:+.3f} s over `python -c pass`; launch 1 process "
          f"{cpu['acc1'] - cpu['py1']:+.3f} s over python; 2 processes {cpu['acc2'] - cpu['torchrun2']:+.3f} s over torchrun")  # fmt: skip


if __name__ == "__main__":
    main()
