"""The hang watchdog measures progress, not CPU: a rank that spins outside the collective the others
wait in is named within the timeout, with its stack; a sleeping rank is still caught.

The fast tests drive :class:`ProgressMonitor` with a made-up clock, and a :class:`Watchdog` over two
real processes started through the launch shim without torch (the "collective" is a sleep in a
module under a ``torch/distributed/`` folder, which is how the watchdog recognises one). The slow
tests launch two gloo processes with ``accelerando launch --hang_timeout 5``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelerando.launchers.watchdog import ProgressMonitor, RunFolder, Verdict, Watchdog

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, sends SIGUSR1")


# --- the decision, on a made-up clock ------------------------------------------------------------


def test_a_rank_idle_for_the_timeout_while_another_spins_is_suspect() -> None:
    monitor = ProgressMonitor(timeout_s=5.0, threshold_s=0.05)
    assert monitor.observe(0.0, {0: 1.0, 1: 1.0}) is None  # first sight: the clocks start
    verdicts = []
    for step in range(1, 13):  # rank 0 waits (no CPU), rank 1 spins (a second of CPU a second)
        verdicts.append(monitor.observe(float(step), {0: 1.0, 1: 1.0 + step}))
    assert verdicts[:4] == [None] * 4  # CPU used by a spinning rank is not progress of the job ...
    assert verdicts[4] == Verdict("suspect", frozenset({0}))  # ... the waiter is suspect after 5 s
    monitor.excuse({0}, 5.0)  # its stack showed it sleeping on its own: look again a timeout later
    assert monitor.observe(9.0, {0: 1.0, 1: 10.0}) is None
    assert monitor.observe(10.0, {0: 1.0, 1: 11.0}) == Verdict("suspect", frozenset({0}))


def test_no_cpu_anywhere_is_idle_and_a_start_or_end_restarts_the_clocks() -> None:
    monitor = ProgressMonitor(timeout_s=5.0, threshold_s=0.05)
    monitor.observe(0.0, {0: 1.0, 1: 2.0})
    assert monitor.observe(4.0, {0: 1.01, 1: 2.0}) is None  # noise below the threshold
    assert monitor.observe(5.0, {0: 1.02, 1: 2.0}) == Verdict("idle", frozenset({0, 1}))
    assert monitor.observe(6.0, {1: 2.0}) is None  # rank 0 ended: progress
    assert monitor.observe(10.0, {1: 2.0}) is None
    assert monitor.observe(11.0, {1: 2.0}) == Verdict("idle", frozenset({1}))
    busy = ProgressMonitor(timeout_s=5.0, threshold_s=0.05)
    busy.observe(0.0, {0: 0.0, 1: 0.0})
    assert all(busy.observe(float(t), {0: t * 0.5, 1: t * 0.5}) is None for t in range(1, 30))  # both work


# --- a Watchdog over real processes (no torch) ---------------------------------------------------

WAIT_MODULE = """\
import time


def all_reduce():
    time.sleep(600)
"""

WORKER = """\
import os
import sys

sys.path.insert(0, sys.argv[1])


def spin():
    while True:
        pass


def nap():
    import time
    time.sleep(600)


if os.environ["RANK"] == "1":
    spin() if sys.argv[2] == "spin" else nap()
from torch.distributed.fake import all_reduce

all_reduce()
"""


def _start(tmp_path: Path, mode: str) -> tuple[RunFolder, list[subprocess.Popen], Path]:
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "fake.py").write_text(WAIT_MODULE)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    procs = []
    for rank in (0, 1):
        argv = [sys.executable, "-m", "accelerando.launchers._child", str(run_dir), str(os.getpid()), "script",
                str(script), str(tmp_path / "fake"), mode]  # fmt: skip
        procs.append(subprocess.Popen(argv, env={**os.environ, "RANK": str(rank)}, start_new_session=True))
    return RunFolder(run_dir), procs, script


@pytest.mark.parametrize("mode", ["spin", "nap"])
def test_the_watchdog_names_the_rank_that_did_not_join_the_collective(tmp_path: Path, mode: str) -> None:
    folder, procs, script = _start(tmp_path, mode)
    try:
        deadline = time.monotonic() + 60
        while len(folder.processes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        watchdog = Watchdog(folder, timeout_s=1.5, poll_s=0.1)
        started = time.monotonic()
        watchdog.start()
        watchdog.join(30)
        took = time.monotonic() - started
        assert watchdog.report is not None, "the watchdog did not stop the job"
        report = watchdog.report
        assert sorted(report.stuck) == [1] and sorted(report.waiting) == [0]
        assert report.stuck[1][0].startswith(f'File "{script}", line ') and report.stuck[1][0].endswith(
            f" in {mode}"
        )
        assert f'File "{script}", line 18 in <module>' in report.stuck[1]
        text = report.describe()
        assert "did not arrive" in text and "process 1 was at" in text
        if mode == "spin":  # the waiter was seen waiting while rank 1 used CPU
            assert report.waited == [0] and "process(es) 0 waited in a collective for 1.5 s" in text
            assert f'process 1 was at File "{script}", line ' in text and " in spin" in text
        assert took < 15
        for proc in procs:
            assert proc.wait(10) != 0  # killed
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# --- real launches -------------------------------------------------------------------------------

SPIN = """\
import torch
import torch.distributed as dist


def spin():
    while True:
        pass


def nap():
    import time
    time.sleep(600)


dist.init_process_group("gloo")
if dist.get_rank() == 1:
    spin() if {spin} else nap()
dist.all_reduce(torch.ones(1))
"""


def _cli() -> list[str]:
    exe = shutil.which("accelerando")
    return [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]


@pytest.mark.slow
@pytest.mark.parametrize("spins", [True, False], ids=["spinning", "sleeping"])
def test_a_launch_names_the_rank_that_spins_or_sleeps_outside_the_all_reduce(
    tmp_path: Path, spins: bool
) -> None:
    script = tmp_path / "hang.py"
    script.write_text(SPIN.format(spin=spins))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    env["ACCELERANDO_CONFIG_FILE"] = str(tmp_path / "none.yaml")
    argv = [*_cli(), "launch", "--cpu", "--num_processes", "2", "--hang_timeout", "5", str(script)]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 124, done.stderr
    assert "process(es) 1 did not arrive" in done.stderr, done.stderr
    at = next(line for line in done.stderr.splitlines() if "process 1 was at" in line)
    assert at.startswith(f'  process 1 was at File "{script}", line ') and at.endswith(
        " in spin" if spins else " in nap"
    )
    assert f'File "{script}", line 17 in <module>' in done.stderr, done.stderr
    assert f'process 0 was waiting for them in a collective, at File "{script}", line 18' in done.stderr
    assert took < 60, took
