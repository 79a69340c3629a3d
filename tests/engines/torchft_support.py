"""Run a fault-tolerant launch of ``torchft_train.py``, kill one replica group, and read what happened.

Shared by ``tests/engines/test_torchft_recovery.py`` and ``benchmarks/bench_engine_restart_torchft.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRAIN_SCRIPT = Path(__file__).resolve().parent / "torchft_train.py"
#: Steps a launch may run at most (the test stops it earlier through ``stop_at``).
MAX_STEPS = 100_000


def launch(
    out_dir: Path,
    *,
    step_sleep: float,
    heartbeat_timeout: float = 1.0,
    max_restarts: int = 1,
    processes: int = 1,
) -> subprocess.Popen[str]:
    """Start ``accelerando launch --fault_tolerance`` with 2 replica groups on CPU (gloo).

    Each group has ``processes`` processes; more than one shard the model with FSDP2 inside the group
    (HSDP). The launcher's output goes to ``out_dir/launch.log``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "TORCHFT"))}
    env.update(OMP_NUM_THREADS="1")
    argv = [
        sys.executable, "-m", "accelerando.commands.launch", "--cpu", "--num_processes", str(processes),
        *(("--use_fsdp", "--fsdp_version", "2", "--parallelism_config_dp_shard_size", str(processes))
          if processes > 1 else ()),
        "--fault_tolerance", "--ft_replica_groups", "2", "--ft_heartbeat_timeout", str(heartbeat_timeout),
        "--ft_timeout", "20", "--max_restarts", str(max_restarts),
        str(TRAIN_SCRIPT), str(out_dir), str(MAX_STEPS), str(step_sleep),
    ]  # fmt: skip
    log = open(out_dir / "launch.log", "w")  # noqa: SIM115 - the child writes it until it exits
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


def read_log(out_dir: Path, replica: int, rank: int = 0) -> list[dict[str, Any]]:
    """The JSON lines process ``rank`` of group ``replica`` wrote so far (a line being written is skipped)."""
    path = out_dir / (f"group{replica}.jsonl" if rank == 0 else f"group{replica}.rank{rank}.jsonl")
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def wait_until(
    condition: Callable[[], bool], launcher: subprocess.Popen[str], timeout: float, what: str
) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` if the launch ends or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if launcher.poll() is not None:
            raise AssertionError(f"the launch ended (status {launcher.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)


def steps_of(records: list[dict[str, Any]], attempt: int | None = None) -> list[dict[str, Any]]:
    """The step records, of one start of the process (``attempt``) or of all."""
    current, found = -1, []
    for record in records:
        if record["event"] == "start":
            current = record["attempt"]
        elif attempt is None or current == attempt:
            found.append(record)
    return found


@dataclass
class KilledRun:
    """What one killed fault-tolerant run measured.

    Attributes:
        kill_step: group 1's committed step count when it was killed.
        kill_time: when it was killed (``time.time()``).
        survivor_steps_while_down: steps group 0 committed between the kill and group 1's first step back.
        longest_pause_s: the longest time between two consecutive committed steps of group 0 after the kill.
        back_step: the committed step count of group 1's first step after its restart.
        back_after_s: seconds from the kill to that step (the killed group training again).
        common_steps: steps both groups logged after group 1's restart.
        unequal_steps: those of them where the two groups' weights differ.
    """

    kill_step: int
    kill_time: float
    survivor_steps_while_down: int
    longest_pause_s: float
    back_step: int
    back_after_s: float
    common_steps: int
    unequal_steps: list[int]


def run_and_kill(
    out_dir: Path, kill_step: int, *, step_sleep: float = 0.05, steps_after: int = 10, processes: int = 1
) -> KilledRun:
    """Launch 2 groups, SIGKILL group 1 (its rank 0) once it committed ``kill_step`` steps, let it recover.

    Both groups stop ``steps_after`` steps after group 1 trained again (``stop_at``). Raises AssertionError
    when the launch fails or a phase does not come within its time limit. The result compares the rank-0
    processes; :func:`measure` compares another rank.
    """
    launcher = launch(out_dir, step_sleep=step_sleep, processes=processes)
    try:
        at_kill = lambda: any(r["step"] >= kill_step for r in steps_of(read_log(out_dir, 1)))  # noqa: E731
        wait_until(at_kill, launcher, 300, f"group 1 committed {kill_step} steps")
        pid = next(r["pid"] for r in read_log(out_dir, 1) if r["event"] == "start")
        os.kill(pid, signal.SIGKILL)
        kill_time = time.time()
        killed_at = max(r["step"] for r in steps_of(read_log(out_dir, 1), attempt=0))
        back = lambda: len(steps_of(read_log(out_dir, 1), attempt=1)) > 0  # noqa: E731
        wait_until(back, launcher, 300, "group 1 trained again after its restart")
        newest = max(r["step"] for r in steps_of(read_log(out_dir, 0)))
        (out_dir / "stop_at").write_text(str(newest + steps_after))
        launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    if launcher.returncode != 0:
        log = (out_dir / "launch.log").read_text()[-4000:]
        raise AssertionError(f"the launch failed with status {launcher.returncode}:\n{log}")
    return measure(out_dir, killed_at, kill_time)


def measure(out_dir: Path, kill_step: int, kill_time: float, rank: int = 0) -> KilledRun:
    """Read the logs of process ``rank`` of both groups after a run of :func:`run_and_kill`."""
    survivor = [r for r in steps_of(read_log(out_dir, 0, rank)) if r["committed"]]
    returned = steps_of(read_log(out_dir, 1, rank), attempt=1)
    first_back = returned[0]
    down = [r for r in survivor if kill_time < r["t"] < first_back["t"]]
    times = [kill_time, *(r["t"] for r in survivor if r["t"] > kill_time)]
    pauses = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    ours = {r["step"]: r["hash"] for r in returned}
    theirs = {r["step"]: r["hash"] for r in survivor}
    common = sorted(set(ours) & set(theirs))
    return KilledRun(
        kill_step=kill_step,
        kill_time=kill_time,
        survivor_steps_while_down=len(down),
        longest_pause_s=max(pauses),
        back_step=first_back["step"],
        back_after_s=first_back["t"] - kill_time,
        common_steps=len(common),
        unequal_steps=[s for s in common if ours[s] != theirs[s]],
    )
