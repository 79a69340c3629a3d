"""Exact resume: a run killed (SIGKILL) right after ``save_state`` and resumed in a fresh process
ends bit-for-bit equal to the uninterrupted run (parameters and optimizer state), for a seeded CPU
run with shuffling, dropout, a scheduler and gradient accumulation; 1 and 2 processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from accelerando.test_utils import DistributedTestError, launch_script

WORKER = os.path.join(os.path.dirname(__file__), "test_checkpoint_worker.py")
STEPS = 20  # 12 batches per epoch: the run crosses one epoch boundary


def _run(project: str, out: str, *extra: str, processes: int = 1, expect_kill: bool = False) -> None:
    args = [project, out, "--steps", str(STEPS), *extra]
    if processes == 1:
        proc = subprocess.run(
            [sys.executable, WORKER, *args], capture_output=True, text=True, timeout=240, check=False
        )
        expected = -signal.SIGKILL if expect_kill else 0
        assert proc.returncode == expected, proc.stderr[-4000:]
        return
    if expect_kill:
        with pytest.raises(DistributedTestError):
            launch_script(WORKER, processes, args, timeout=240)
    else:
        launch_script(WORKER, processes, args, timeout=240)


def _assert_bitwise_equal(a_path: str, b_path: str) -> None:
    a, b = torch.load(a_path), torch.load(b_path)
    for name, tensor in a["params"].items():
        assert torch.equal(tensor, b["params"][name]), f"parameter {name} differs"
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        for field, value in state_a[key].items():
            assert torch.equal(value, state_b[key][field]), f"optimizer state {key}.{field} differs"
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]


def _scenario(tmp_path, processes: int, kill_points: list[int], stateful: bool = False) -> None:
    flags = ["--stateful"] if stateful else []
    reference = str(tmp_path / "reference.pt")
    _run(str(tmp_path / "ref"), reference, *flags, processes=processes)
    for k in kill_points:
        project, out = str(tmp_path / f"run_{k}"), str(tmp_path / f"resumed_{k}.pt")
        _run(project, out, "--kill-at", str(k), *flags, processes=processes, expect_kill=True)
        assert not os.path.exists(out)
        _run(project, out, *flags, processes=processes)  # same command again: auto-resume
        _assert_bitwise_equal(reference, out)


def test_exact_resume_one_process(tmp_path) -> None:
    # k=7: mid-epoch and mid accumulation cycle; k=12: last batch of the first epoch.
    _scenario(tmp_path, 1, [7, 12])


def test_exact_resume_two_processes_mid_epoch(tmp_path) -> None:
    _scenario(tmp_path, 2, [5])


@pytest.mark.slow
def test_exact_resume_two_processes_epoch_boundary(tmp_path) -> None:
    _scenario(tmp_path, 2, [6])  # 6 batches per process and epoch with 2 processes
