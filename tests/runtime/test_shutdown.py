"""A finished training exits 0, a failed process ends the launch, and teardown never hangs.

Real processes: two through ``accelerando launch --cpu --num_processes 2`` (the launcher's elastic
agent hosts the rendezvous store), and two plain ``python`` processes with the rendezvous variables
set by hand (rank 0 hosts the store; no agent stops a survivor, so a hang in teardown would show).
Bounds are generous subprocess timeouts, never precise timings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.test_utils.distributed import get_free_port

TRAIN = """\
import os, signal, sys
import torch
from torch.nn.parallel import DistributedDataParallel
from accelerando.state import PartialState

mode = sys.argv[1]
state = PartialState()
rank = state.process_index
model = DistributedDataParallel(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    if mode == "kill" and rank == 1 and step == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
if mode == "destroy":
    if rank == 0:
        torch.distributed.destroy_process_group()  # torch's own call, no agreement
    else:
        state.destroy_process_group()  # ours, twice: the second is a no-op
        state.destroy_process_group()
print(f"rank {rank} finished", flush=True)
"""

# Plain processes on the process_group module itself, with a short exit-time bound.
PLAIN = """\
import os, signal, sys, time
import torch
import torch.distributed as dist
from accelerando.core import process_group

mode, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
handle = process_group.start(
    device=torch.device("cpu"), default_backend="gloo", main_address="127.0.0.1", main_port=port,
    rank=rank, world_size=2, shutdown_timeout_s=float(sys.argv[4]),
)
total = torch.ones(1)
dist.all_reduce(total)
assert total.item() == 2.0 and handle.backend == "gloo"
print(f"rank {rank} finished", flush=True)
if rank == 1 and mode == "vanish":
    os.kill(os.getpid(), signal.SIGKILL)  # never reaches the teardown agreement
if rank == 1 and mode == "raise":
    raise RuntimeError("rank 1 failed at the end")
if mode == "late":
    import torch.distributed.nn.functional  # what DDP does (through torch._dynamo) after the start
    if rank == 0:  # a collective completing late runs a Python callback on a gloo worker thread
        late = dist.all_reduce(total, async_op=True).get_future().then(lambda f: f.value())

        class Slow:
            def __del__(self):
                time.sleep(1)  # during interpreter finalization, without the GIL

        slow = Slow()
    else:
        time.sleep(0.5)
        dist.all_reduce(total)
"""


def _launcher() -> list[str]:
    beside = Path(sys.executable).parent / "accelerando"
    found = str(beside) if beside.is_file() else shutil.which("accelerando")
    return [found] if found else [sys.executable, "-m", "accelerando"]


@pytest.fixture
def env(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE", "ACCELERANDO"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        clean.pop(name, None)
    clean.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    return clean


def _launch(
    tmp_path: Path, env: dict[str, str], mode: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    command = [*_launcher(), "launch", "--cpu", "--num_processes", "2", str(script), mode]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def _plain_pair(tmp_path: Path, env: dict[str, str], mode: str, bound_s: float) -> list[tuple[int, str]]:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    port = str(get_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), mode, str(rank), port, str(bound_s)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=45)[0] for proc in procs]
        return [(proc.returncode, out) for proc, out in zip(procs, outputs, strict=True)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_finished_training_exits_zero(tmp_path, env):
    done = _launch(tmp_path, env, "train")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("finished") == 2
    assert "terminate called" not in done.stderr


def test_killed_process_ends_the_launch_and_is_named(tmp_path, env):
    done = _launch(tmp_path, env, "kill", timeout_s=60)  # the timeout is the hang check
    assert done.returncode != 0
    assert "accelerando launch: process 1 (" in done.stderr and "SIGKILL" in done.stderr, done.stderr
    assert "rank 1 finished" not in done.stdout


@pytest.mark.slow
def test_destroying_the_group_before_exit_still_exits_zero(tmp_path, env):
    done = _launch(tmp_path, env, "destroy")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("finished") == 2
    assert "terminate called" not in done.stderr


def test_a_gloo_worker_never_enters_python_during_finalization(tmp_path, env):
    # Before the ordered teardown this aborted every time: "terminate called without an active
    # exception", exit 134, after both processes had finished.
    results = _plain_pair(tmp_path, env, "late", bound_s=30)
    assert [code for code, _ in results] == [0, 0], results
    assert not any("terminate called" in out for _, out in results)


@pytest.mark.slow
def test_survivor_does_not_wait_past_the_bound_for_a_vanished_peer(tmp_path, env):
    (code0, out0), (code1, _) = _plain_pair(tmp_path, env, "vanish", bound_s=3)
    assert code1 == -9
    assert code0 == 0, out0
    assert "terminate called" not in out0


def test_failing_peer_releases_the_survivor_at_once(tmp_path, env):
    # The bound is far above the 45 s subprocess timeout: only the failing peer's release ends the wait.
    (code0, out0), (code1, out1) = _plain_pair(tmp_path, env, "raise", bound_s=600)
    assert code1 == 1 and "rank 1 failed at the end" in out1
    assert code0 == 0, out0
    assert "terminate called" not in out0 + out1


def test_the_report_blames_the_killed_process_over_the_peer_that_lost_it(capsys):
    from types import SimpleNamespace

    from accelerando.launchers.runner import _report_failure

    def failure(rank: int, exitcode: int) -> SimpleNamespace:
        # The agent stamps both in the same second when it sees them at one poll.
        return SimpleNamespace(local_rank=rank, pid=100 + rank, exitcode=exitcode, timestamp=7)

    code = _report_failure(SimpleNamespace(failures={0: failure(0, 1), 1: failure(1, -9)}))
    line = capsys.readouterr().err
    assert code == 137
    assert "process 1 (local rank 1, pid 101) was killed by signal 9 (SIGKILL)." in line
    assert "Also: process 0 failed with exit code 1. 2 process(es) failed in all." in line


def test_the_report_never_blames_the_agents_own_sigterm(capsys):
    from types import SimpleNamespace

    from accelerando.launchers.runner import _report_failure

    stopped = SimpleNamespace(local_rank=0, pid=100, exitcode=-15, timestamp=7)
    raised = SimpleNamespace(local_rank=1, pid=101, exitcode=1, timestamp=7)
    assert _report_failure(SimpleNamespace(failures={0: stopped, 1: raised})) == 1
    assert "process 1 (local rank 1, pid 101) failed with exit code 1" in capsys.readouterr().err
