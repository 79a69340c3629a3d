"""One writer per project folder: a second run saving into the same project is refused on every rank (or
waits, when asked to), nothing is ever damaged or mixed, and the lock of a killed run does not block.

Runs are processes from a fork server (concurrent_worker.py); what each saves is marked with its run
id, so a checkpoint mixing two runs' files would show.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest
import torch

from accelerando.checkpointing import atomic, lock
from accelerando.checkpointing.lock import CheckpointLockedError
from accelerando.test_utils import get_free_port
from suite_support import reset_accelerator_state

sys.path.insert(0, os.path.dirname(__file__))
import concurrent_worker as worker  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_state")


def _log(path: str, rank: int = 0) -> dict:
    with open(f"{path}.{rank}") as handle:
        return json.load(handle)


def _saved(log: dict) -> list[int]:
    return [int(e["saved"].rsplit("_", 1)[1]) for e in log["events"] if "saved" in e]


def _check_remaining(project: str, run: int) -> list[int]:
    """Every remaining checkpoint verifies, loads, and holds one run's state only. Returns the numbers."""
    root = os.path.join(project, "checkpoints")
    assert [n for n in os.listdir(root) if n.startswith(".")] == []  # no staging or trash left
    found = atomic.list_checkpoints(root)
    for _, path in found:
        atomic.verify_checkpoint(path, checksums=True)
        reset_accelerator_state()
        accelerator, model, mark = worker.build(project, run=0)
        accelerator.load_state(path)
        values = {float(v) for p in model.parameters() for v in p.detach().flatten()}
        assert mark.run == run and values == {float(run * 1000 + mark.save)}, (path, mark.run, values)
        optimizer_state = torch.load(os.path.join(path, "optimizer.bin"), weights_only=True)
        assert optimizer_state["state"], "the optimizer state is missing"
    return [number for number, _ in found]


def test_second_run_is_refused_on_every_rank_and_the_first_keeps_its_checkpoints(tmp_path) -> None:
    ctx = worker.forkserver_context()
    project = str(tmp_path / "project")
    log_a, log_b = str(tmp_path / "a"), str(tmp_path / "b")
    first_saved, go, linger, ready = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    run_a = ctx.Process(
        target=worker.saver,
        args=(project, 1, 20, log_a),
        kwargs={"first_saved": first_saved, "go": go, "linger": linger},
    )
    run_a.start()
    assert first_saved.wait(timeout=120), "run A never saved"
    port = get_free_port()
    run_b = [
        ctx.Process(
            target=worker.rank_saver,
            args=(rank, 2, port, project, 2, 20, log_b),
            kwargs={"ready": ready, "wait_for_lock": 1.0, "wait_slice": 0.2},  # several rounds of waiting
        )
        for rank in range(2)
    ]
    for proc in run_b:
        proc.start()
    assert ready.wait(timeout=120), "run B never got ready"
    go.set()  # A saves on while B tries
    for proc in run_b:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in run_b] == [0, 0]  # nobody hung, every rank returned
    linger.set()
    run_a.join(timeout=120)
    assert run_a.exitcode == 0

    a = _log(log_a)
    assert _saved(a) == list(range(20)) and not [e for e in a["events"] if "refused" in e]
    refusals = [_log(log_b, rank)["events"] for rank in (0, 1)]
    assert all(len(events) == 1 and "refused" in events[0] for events in refusals), refusals
    message = refusals[0][0]["refused"]
    assert refusals[1][0]["refused"] == message  # the same error on every rank
    root = os.path.abspath(os.path.join(project, "checkpoints"))
    for fragment in (
        root,
        f"pid {a['pid']}",
        "another process",
        "still held after waiting 1 s",
        "project_dir",
    ):
        assert fragment in message, (fragment, message)
    assert _check_remaining(project, run=1) == [18, 19]


def test_second_run_waits_when_asked_then_saves_alone(tmp_path) -> None:
    ctx = worker.forkserver_context()
    project = str(tmp_path / "project")
    log_a, log_b = str(tmp_path / "a"), str(tmp_path / "b")
    first_saved, go, ready = ctx.Event(), ctx.Event(), ctx.Event()
    run_a = ctx.Process(
        target=worker.saver, args=(project, 1, 20, log_a), kwargs={"first_saved": first_saved, "go": go}
    )
    run_a.start()
    assert first_saved.wait(timeout=120), "run A never saved"
    run_b = ctx.Process(
        target=worker.saver, args=(project, 2, 20, log_b), kwargs={"wait_for_lock": 120.0, "ready": ready}
    )
    run_b.start()
    assert ready.wait(timeout=120), "run B never got ready"
    go.set()
    for proc in (run_a, run_b):
        proc.join(timeout=180)
    assert [run_a.exitcode, run_b.exitcode] == [0, 0]

    a, b = _log(log_a), _log(log_b)
    assert _saved(a) == list(range(20))
    assert _saved(b) == list(range(20, 40))  # numbering continues after A's checkpoints
    assert b["events"][0]["at"] >= a["exit"]  # B's first save ended only after A was done
    assert _check_remaining(project, run=2) == [38, 39]


@pytest.mark.parametrize("fork_child", [False, True], ids=["alone", "with-forked-child"])
def test_lock_of_a_killed_run_does_not_block(tmp_path, fork_child: bool) -> None:
    """kill -9 of the holder frees the lock, even when it forked a child that lives on."""
    ctx = worker.forkserver_context()
    project = str(tmp_path / "project")
    ready, child_pid = ctx.Event(), ctx.Value("i", 0)
    holder = ctx.Process(target=worker.hold_lock_then_sleep, args=(project, ready, fork_child, child_pid))
    holder.start()
    try:
        assert ready.wait(timeout=120), "the holder never saved"
        accelerator, _, _ = worker.build(project, run=3)
        with pytest.raises(CheckpointLockedError, match=f"pid {holder.pid} on host"):
            accelerator.save_state()
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(timeout=30)
        accelerator.load_state()  # a restarted run resumes, then saves
        assert os.path.basename(accelerator.save_state()) == "checkpoint_1"
        accelerator._checkpoints.target.release_locks()
    finally:
        if child_pid.value:
            os.kill(child_pid.value, signal.SIGKILL)
        if holder.is_alive():
            os.kill(holder.pid, signal.SIGKILL)


def _other_process_lock(path: str) -> int:
    """Lock ``path`` through a separate open file, as another process would (flock sees no difference)."""
    return lock._acquire_project(path, 0.0, "test", "0" * 32)


def test_accelerators_of_one_process_share_the_lock_until_both_are_released(tmp_path) -> None:
    project = str(tmp_path / "project")
    first, _, _ = worker.build(project, run=1)
    first.save_state()
    reset_accelerator_state()
    second, _, _ = worker.build(project, run=2)
    second.load_state()
    assert os.path.basename(second.save_state()) == "checkpoint_1"  # same process: no refusal
    path = lock.project_lock_path(project)
    with pytest.raises(CheckpointLockedError, match="another process"):
        _other_process_lock(path)
    first._checkpoints.target.release_locks()
    assert lock.holds(path)
    del second
    import gc

    gc.collect()  # a freed Accelerator gives its share up
    assert not lock.holds(path)
    os.close(_other_process_lock(path))


def test_the_project_lock_leaves_no_file_in_the_project(tmp_path) -> None:
    """The lock is on the checkpoints folder itself: listing the project or its checkpoints shows
    only checkpoints, while the lock still refuses another process."""
    project = str(tmp_path / "project")
    accelerator, _, _ = worker.build(project, run=1)
    try:
        accelerator.save_state()
        assert os.listdir(project) == ["checkpoints"]
        assert os.listdir(os.path.join(project, "checkpoints")) == ["checkpoint_0"]
        with pytest.raises(CheckpointLockedError, match=f"pid {os.getpid()} on host"):
            _other_process_lock(lock.project_lock_path(project))
    finally:
        accelerator._checkpoints.target.release_locks()


def test_project_lock_falls_back_to_a_file_where_folders_cannot_be_locked(tmp_path, monkeypatch) -> None:
    monkeypatch.delattr(os, "O_DIRECTORY")
    project = str(tmp_path / "project")
    fd = _other_process_lock(lock.project_lock_path(project))
    try:
        assert os.path.isfile(os.path.join(project, lock.PROJECT_LOCK_NAME))
        with pytest.raises(CheckpointLockedError, match=f"pid {os.getpid()} on host"):
            _other_process_lock(lock.project_lock_path(project))
    finally:
        os.close(fd)


def test_refusal_and_wait_in_one_process(tmp_path, monkeypatch) -> None:
    """The project lock held elsewhere: refused at once by default, or after a bounded wait; a wait
    that outlasts the holder succeeds."""
    from accelerando.checkpointing import save

    monkeypatch.setattr(save, "_WAIT_SLICE_S", 0.05)  # waits go in many rounds
    project = str(tmp_path / "project")
    path = lock.project_lock_path(project)
    fd = _other_process_lock(path)
    accelerator, _, _ = worker.build(project, run=1)
    try:
        with pytest.raises(CheckpointLockedError, match="another process is writing"):
            accelerator.save_state()
        start = time.monotonic()
        with pytest.raises(CheckpointLockedError, match="still held after waiting 0.3 s"):
            accelerator.save_state(wait_for_lock=0.3)
        assert time.monotonic() - start >= 0.3
        assert not os.path.exists(os.path.join(project, "checkpoints", "checkpoint_0"))
        threading.Timer(0.3, os.close, args=(fd,)).start()
        assert os.path.basename(accelerator.save_state(wait_for_lock=30)) == "checkpoint_0"
    finally:
        accelerator._checkpoints.target.release_locks()
    with pytest.raises(ValueError, match="seconds >= 0"):
        accelerator.save_state(wait_for_lock=-1)
    with pytest.raises(TypeError, match="number of seconds"):
        accelerator.save_state(wait_for_lock="10")


def test_explicit_folder_saves_are_one_at_a_time_and_staged_per_run(tmp_path, monkeypatch) -> None:
    from accelerando import Accelerator

    out = str(tmp_path / "ckpt")
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    staged: list[str] = []
    real_prepare = atomic.prepare_staging
    monkeypatch.setattr(atomic, "prepare_staging", lambda *a: staged.append(real_prepare(*a)) or staged[-1])
    with lock.save_lock(out, 0.0, "1" * 32):  # another process is saving the same folder
        with pytest.raises(CheckpointLockedError, match="ckpt"):
            accelerator.save_state(out)
    (tmp_path / ".ckpt.partial").mkdir()  # left by an interrupted save: cleaned
    (tmp_path / ".ckpt.v2.partial").mkdir()  # another folder's: left alone
    accelerator.save_state(out)
    accelerator.save_state(out)
    assert len(staged) == 2 and all(".ckpt." in s and s.endswith(".partial") for s in staged)
    assert os.path.basename(staged[0]) not in (".ckpt.partial",)  # named after the run
    atomic.wait_for_removals()  # the replaced folder is removed in the background
    assert sorted(os.listdir(tmp_path)) == [".ckpt.v2.partial", "ckpt"]  # no lock file left behind
    atomic.verify_checkpoint(out, checksums=True)
    del model
