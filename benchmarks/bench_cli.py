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


def _first_line_delay(command: list[str], out: Path, env: dict[str, str]) -> float:
    for old in out.iterdir():
        old.unlink()
    start = time.time()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return max(float(p.read_text()) for p in out.iterdir()) - start


def _wall(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
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
        help_time = _interleave(runs, {"help": lambda: _wall([*cli, "--help"], env)})["help"]
        one = _interleave(runs, {
            "python": lambda: _first_line_delay([sys.executable, str(script), str(out)], out, env),
            "accelerando": lambda: _first_line_delay([*cli, "launch", "--num_processes", "1", str(script), str(out)], out, env),
        })  # fmt: skip
        two = _interleave(runs, {
            "torchrun": lambda: _first_line_delay([*torchrun, "--nproc_per_node", "2", "--master_port", "0",
                                                   str(script), str(out)], out, env),
            "accelerando": lambda: _first_line_delay([*cli, "launch", "--cpu", "--num_processes", "2",
                                                      str(script), str(out)], out, env),
        })  # fmt: skip
    print(f"median of {runs} interleaved runs, {os.cpu_count()} CPUs")
    print(f"accelerando --help:                         {help_time:.3f} s  (target <= 0.25 s)")
    print(f"1 process, to first line: python {one['python']:.3f} s, accelerando launch {one['accelerando']:.3f} s"
          f" -> overhead {one['accelerando'] - one['python']:+.3f} s  (target <= 0.3 s)")  # fmt: skip
    print(f"2 processes, to first line: torchrun {two['torchrun']:.3f} s, accelerando launch "
          f"{two['accelerando']:.3f} s -> overhead {two['accelerando'] - two['torchrun']:+.3f} s  (target <= 0.2 s)")  # fmt: skip


if __name__ == "__main__":
    main()
