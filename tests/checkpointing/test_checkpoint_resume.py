"""Exact resume: a run killed (SIGKILL) right after ``save_state`` and resumed in a fresh process
ends bit-for-bit equal to the uninterrupted run (parameters and optimizer state), for a seeded CPU
run with shuffling, dropout, a scheduler and gradient accumulation; 1 and 2 processes."""

from __future__ import annotations

import os
import signal
import sys

import torch

from accelerando.test_utils import get_free_port

sys.path.insert(0, os.path.dirname(__file__))
import test_checkpoint_worker as worker  # noqa: E402

STEPS = 20  # 12 batches per epoch with one process: the run crosses an epoch boundary


def _run(
    project: str,
    out: str,
    kill_at: int = -1,
    stateful: bool = False,
    processes: int = 1,
    own_generator: bool = True,
    mapped_loads: bool = False,
) -> None:
    ctx = worker.forkserver_context()
    port = get_free_port()
    args = (project, out, STEPS, kill_at, stateful, own_generator, mapped_loads)
    procs = [ctx.Process(target=worker.rank_entry, args=(r, processes, port, args)) for r in range(processes)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    expected = -signal.SIGKILL if kill_at > 0 else 0
    assert [p.exitcode for p in procs] == [expected] * processes


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


def _scenario(
    tmp_path,
    processes: int,
    kill_points: list[int],
    stateful: bool = False,
    own_generator: bool = True,
    mapped_loads: bool = False,
) -> None:
    opts = {
        "stateful": stateful,
        "processes": processes,
        "own_generator": own_generator,
        "mapped_loads": mapped_loads,
    }
    reference = str(tmp_path / "reference.pt")
    _run(str(tmp_path / "ref"), reference, **opts)
    for k in kill_points:
        project, out = str(tmp_path / f"run_{k}"), str(tmp_path / f"resumed_{k}.pt")
        _run(project, out, kill_at=k, **opts)
        assert not os.path.exists(out)
        _run(project, out, **opts)  # the same run again: auto-resume
        _assert_bitwise_equal(reference, out)


def test_exact_resume_one_process(tmp_path) -> None:
    # k=7: mid-epoch and mid accumulation cycle; k=12: last batch of the first epoch.
    _scenario(tmp_path, 1, [7, 12])


def test_exact_resume_two_processes_mid_epoch(tmp_path) -> None:
    _scenario(tmp_path, 2, [5])


def test_exact_resume_two_processes_with_memory_mapped_optimizer_loads(tmp_path) -> None:
    _scenario(tmp_path, 2, [5], mapped_loads=True)  # the path big optimizer files take


def test_exact_resume_two_processes_epoch_boundary(tmp_path) -> None:
    _scenario(tmp_path, 2, [6])  # 6 batches per process and epoch with 2 processes


def test_exact_resume_one_process_stateful_loader(tmp_path) -> None:
    # Stateful mode: the loader resumes its position itself (ResumePoint.batches_to_skip is 0).
    _scenario(tmp_path, 1, [7], stateful=True)


def test_exact_resume_loader_without_generator(tmp_path) -> None:
    _scenario(tmp_path, 1, [7], own_generator=False)
