"""A process killed mid-training: torchft's per-step fault tolerance against the restart path, same run.

Two ways to survive a SIGKILL of one of two CPU processes (gloo), measured one after the other in
one invocation of this script, on the same machine:

- restart path: ``accelerando launch --num_processes 2 --max_restarts 1 --auto_resume``
  (``benchmarks/bench_restart.py``): the elastic agent stops the survivor, restarts both processes,
  and ``auto_resume`` loads the last checkpoint. Every process stands still from the kill until
  "training again": that time is the healthy process's pause too.
- torchft: ``accelerando launch --fault_tolerance --ft_replica_groups 2 --max_restarts 1
  --ft_heartbeat_timeout 1`` (``tests/engines/torchft_support.py``): group 1 is killed at a random
  step; group 0 keeps committing steps; group 1 restarts and copies group 0's weights (no checkpoint).

Printed per path: the healthy process's longest pause after the kill, and the time from the kill to
the killed process training again; for torchft also the steps group 0 committed while group 1 was
down and whether group 1's weights equal group 0's at every common step after its return.

Usage: ``python benchmarks/bench_engine_restart_torchft.py [--repeats N]`` (needs the ``torchft``
extra; Linux; about 3 minutes per repeat on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "tests" / "engines")]

from bench_restart import one_run  # noqa: E402
from torchft_support import run_and_kill  # noqa: E402


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s" if values else "   n/a"


def main() -> None:
    """Run both paths ``--repeats`` times and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--seed", type=int, default=0, help="Chooses the step at which torchft's group 1 dies."
    )
    args = parser.parse_args()
    choose = random.Random(args.seed)
    restart: list[dict[str, float]] = []
    torchft = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-restart-") as folder:
            restart.append(one_run(Path(folder)))
        with tempfile.TemporaryDirectory(prefix="bench-torchft-") as folder:
            torchft.append(run_and_kill(Path(folder), choose.randint(3, 15)))
    back = [r["training again"] for r in restart if "training again" in r]
    print(f"a process of 2 killed (SIGKILL); median of {args.repeats}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':44}{'healthy pause':>14}{'killed back':>14}")
    print(f"{'restart path (--max_restarts + auto_resume)':44}{_median(back):>14}{_median(back):>14}")
    pauses = [run.longest_pause_s for run in torchft]
    returns = [run.back_after_s for run in torchft]
    print(f"{'torchft (--fault_tolerance, 2 groups)':44}{_median(pauses):>14}{_median(returns):>14}")
    for run in torchft:
        print(
            f"  torchft: killed after step {run.kill_step}; group 0 committed {run.survivor_steps_while_down} "
            f"steps while group 1 was down; group 1 came back at step {run.back_step}; "
            f"{run.common_steps} common steps, weights unequal at {run.unequal_steps or 'none'}"
        )


if __name__ == "__main__":
    main()
