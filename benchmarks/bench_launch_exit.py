"""Does a finished training always exit 0? The README's first command, many times, on a busy machine.

Runs ``accelerando launch --cpu --num_processes 2 examples/quickstart.py --epochs 1`` ``--runs`` times
while ``--hogs`` busy-looping processes compete for the CPUs (a busy machine is what turns teardown
races into failures), then prints how many runs ended with each exit code, how many printed
"terminate called" (a C++ abort during teardown), and the median wall time of one launch.
The goal is every run exiting 0.

Run: ``nice -n 5 python benchmarks/bench_launch_exit.py [--runs 200] [--hogs 2]``.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
HOG = "while True:\n    pass\n"


def _launcher() -> list[str]:
    # The console script next to this interpreter, not a version-manager shim that adds its own start-up.
    beside = Path(sys.executable).parent / "accelerando"
    found = str(beside) if beside.is_file() else shutil.which("accelerando")
    return [found] if found else [sys.executable, "-m", "accelerando"]


def _one_run(command: list[str], timeout_s: float) -> tuple[int | str, float, bool, str]:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
        return "timeout", time.perf_counter() - start, "terminate called" in stderr, stderr
    elapsed = time.perf_counter() - start
    return done.returncode, elapsed, "terminate called" in done.stderr, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--hogs", type=int, default=2, help="busy-looping processes running beside")
    parser.add_argument("--epochs", type=int, default=1, help="quickstart epochs per run (short runs)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before one run counts as hung")
    parser.add_argument("--show-failures", type=int, default=3, help="stderr tails of failed runs to print")
    args = parser.parse_args()

    hogs = [
        subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.DEVNULL) for _ in range(args.hogs)
    ]
    codes: collections.Counter[int | str] = collections.Counter()
    aborts = 0
    times: list[float] = []
    failures: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="accelerando-bench-exit-") as folder:
            command = [
                *_launcher(),
                "launch",
                "--cpu",
                "--num_processes",
                "2",
                str(ROOT / "examples" / "quickstart.py"),
                "--epochs",
                str(args.epochs),
                "--project_dir",
                folder,
            ]
            for index in range(args.runs):
                code, elapsed, aborted, stderr = _one_run(command, args.timeout)
                codes[code] += 1
                aborts += aborted
                times.append(elapsed)
                if code != 0 or aborted:
                    failures.append(f"run {index}: exit {code}\n{stderr[-1500:]}")
                    print(f"run {index}: exit {code}{' (terminate called)' if aborted else ''}", flush=True)
                if (index + 1) % 20 == 0:
                    print(f"{index + 1} runs: {dict(codes)}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    for text in failures[: args.show_failures]:
        print("-" * 60, text, sep="\n")
    print("-" * 60)
    print(
        f"command: accelerando launch --cpu --num_processes 2 examples/quickstart.py --epochs {args.epochs}"
    )
    print(f"runs: {args.runs}, CPU hogs beside: {args.hogs}")
    print("exit codes: " + ", ".join(f"{code}: {count}" for code, count in sorted(codes.items(), key=str)))
    print(f"exit 0: {codes[0]}/{args.runs}; 'terminate called' in stderr: {aborts}")
    print(f"median launch wall time: {statistics.median(times):.2f} s")


if __name__ == "__main__":
    main()
