"""Faults around launched processes: a killed launcher, a rank that hangs, a rank that fails first.

The scripts import no torch (only the launcher does), so each launch costs about one torch import.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from accelerando.launchers._child import SHIM_FILES
from accelerando.launchers.runner import _report_failure
from accelerando.launchers.watchdog import HangReport, main_thread_stack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")

# Each process writes its pid, then sleeps until killed.
SLEEPER = """\
import os, sys, time
rank = os.environ.get("RANK", "0")
pid_file = os.path.join(sys.argv[1], f"worker{rank}.pid")
with open(pid_file + ".tmp", "w") as f:  # renamed when written: the test never reads an empty file
    f.write(str(os.getpid()))
os.replace(pid_file + ".tmp", pid_file)
time.sleep(600)
"""

# Rank 1 stops in a function of its own; rank 0 finishes at once.
HANG = """\
import os, time

def wait_for_nothing():
    time.sleep(600)

if os.environ["RANK"] == "1":
    wait_for_nothing()
"""

# Rank 1 raises at once; rank 0 fails as a victim would: when rank 1, exiting, closes its side (the
# marker, written at exit as a closed connection would be). Both fail within one agent poll, so the
# agent's own time stamps (whole seconds, taken when it sees them) cannot tell them apart.
FIRST = """\
import atexit, os, sys, time
marker = os.path.join(sys.argv[1], "rank1.gone")
if os.environ["RANK"] == "1":
    atexit.register(lambda: open(marker, "w").close())
    raise ValueError("the root cause on rank 1")
while not os.path.exists(marker):
    time.sleep(0.01)
raise ConnectionError("peer closed the connection")
"""


@pytest.fixture
def env(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO", "FSDP_"))}
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    return clean


def cli() -> list[str]:
    exe = shutil.which("accelerando")
    return [exe] if exe else [sys.executable, "-m", "accelerando.commands.cli"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_sigkill_of_the_launcher_ends_its_processes(tmp_path, env):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    launches = {}
    for n in (1, 2):  # the simple launch (one subprocess) and the elastic agent's processes, side by side
        out = tmp_path / f"n{n}"
        out.mkdir()
        argv = [*cli(), "launch", "--cpu", "--num_processes", str(n), str(script), str(out)]
        launches[n] = (
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            out,
        )
    try:
        for n, (_, out) in launches.items():
            assert _wait_for(lambda out=out, n=n: len(list(out.glob("worker*.pid"))) == n, 90), n
        workers = {
            n: [int(p.read_text()) for p in out.glob("worker*.pid")] for n, (_, out) in launches.items()
        }
        assert all(_alive(pid) for pids in workers.values() for pid in pids)
        for launcher, _ in launches.values():
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()
        for n, pids in workers.items():
            assert _wait_for(lambda pids=pids: not any(_alive(p) for p in pids), 5), (n, pids)
    finally:
        for launcher, out in launches.values():
            launcher.kill()
            for pid_file in out.glob("worker*.pid"):
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
                except OSError:
                    pass


def test_a_rank_that_hangs_ends_the_job_naming_it_and_where_it_was(tmp_path, env):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    start = time.monotonic()
    argv = [*cli(), "launch", "--cpu", "--num_processes", "2", "--hang_timeout", "2", str(script)]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
    took = time.monotonic() - start
    assert result.returncode == 124, result.stderr
    assert "no process made progress for 2 s (hang_timeout): process(es) 1 did not arrive." in result.stderr
    assert f'process 1 was at File "{script}", line 4 in wait_for_nothing' in result.stderr
    assert f'File "{script}", line 7 in <module>' in result.stderr
    assert "_child.py" not in result.stderr and "runpy" not in result.stderr  # the shim stays out of sight
    assert "process(es) 0 had already exited." in result.stderr
    assert took < 60


def test_the_summary_names_the_rank_that_failed_first(tmp_path, env):
    script = tmp_path / "first.py"
    script.write_text(FIRST)
    argv = [*cli(), "launch", "--cpu", "--num_processes", "2", str(script), str(tmp_path)]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
    assert result.returncode == 1, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith("accelerando launch: process 1 (local rank 1, pid "), summary
    cause = f"(ValueError at {script}:5, 'the root cause on rank 1')"
    # Under load the agent may stop rank 1 (SIGTERM) while it is still exiting after its error; the
    # summary then says so, still naming rank 1 and its exception first.
    assert f"failed with exit code 1 {cause}" in summary or f"raised an exception {cause} and then" in summary
    assert "Also: process 0 " in summary  # failed, or was stopped by the agent before it could
    # Tracebacks start at the script: the launch shim's and runpy's frames are left out.
    # One traceback per process that raised. Process 0 raises its own error once rank 1 is gone; the
    # agent may stop it (SIGTERM) before that, or after it printed its traceback but before its exit was
    # recorded: a stopped process 0 shows its traceback or none, a process 0 that failed shows it.
    stopped = "Also: process 0 was killed by signal" in summary
    raised_on_0 = "ConnectionError: peer closed the connection" in result.stderr
    assert raised_on_0 or stopped, result.stderr
    assert result.stderr.count("Traceback (most recent call last)") == 1 + raised_on_0, result.stderr
    assert "_child.py" not in result.stderr and "runpy" not in result.stderr


def test_exact_failure_times_order_errors_seen_in_the_same_second(capsys):
    from types import SimpleNamespace

    def failure(rank: int) -> SimpleNamespace:
        return SimpleNamespace(local_rank=rank, pid=100 + rank, exitcode=1, timestamp=7)

    records = {
        0: {"time_ns": 7_600_000_000, "type": "RuntimeError", "message": "x" * 500, "where": "a.py:1"},
        1: {"time_ns": 7_500_000_000, "type": "ValueError", "message": "root", "where": "b.py:2"},
    }
    assert _report_failure(SimpleNamespace(failures={0: failure(0), 1: failure(1)}), records) == 1
    line = capsys.readouterr().err
    assert "process 1 (local rank 1, pid 101) failed with exit code 1 (ValueError at b.py:2, 'root')" in line
    # A kill seen in the same second still comes first (it has no record, and is the likelier cause).
    killed = SimpleNamespace(local_rank=2, pid=102, exitcode=-9, timestamp=7)
    _report_failure(SimpleNamespace(failures={0: failure(0), 1: failure(1), 2: killed}), records)
    assert "process 2 (local rank 2, pid 102) was killed by signal 9" in capsys.readouterr().err


def test_stack_classification_names_who_did_not_arrive():
    dump = (
        "Thread 0x00000000000000aa (most recent call first):\n"
        '  File "/lib/threading.py", line 1 in run\n\n'
        "Current thread 0x00000000000000bb (most recent call first):\n"
        '  File "/site/torch/distributed/distributed_c10d.py", line 9 in all_reduce\n'
        '  File "/x/train.py", line 3 in <module>\n'
        f'  File "{SHIM_FILES[0]}", line 9 in main\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    frames = main_thread_stack(dump, 0xBB)
    assert frames == [
        'File "/site/torch/distributed/distributed_c10d.py", line 9 in all_reduce',
        'File "/x/train.py", line 3 in <module>',
    ]
    text = HangReport(5.0, stuck={1: ['File "/x/t.py", line 2 in f']}, waiting={0: frames}).describe()
    assert "process(es) 1 did not arrive" in text
    assert 'process 0 was waiting for them in a collective, at File "/x/train.py", line 3' in text
