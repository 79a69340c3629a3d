"""Crash safety: SIGKILL a process at random moments of ``save_state`` (and inside rotation and
flushing), then check that no complete checkpoint was lost and the next run resumes from the newest.

Children come from a fork server that has torch and accelerando preloaded, so a trial costs a fork
and a few saves rather than an interpreter start.
"""

from __future__ import annotations

import os
import random
import signal
import sys

from accelerando.checkpointing import atomic

sys.path.insert(0, os.path.dirname(__file__))
import test_checkpoint_worker as worker  # noqa: E402


def _log(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [line.split() for line in handle.read().splitlines() if line.strip()]


def _run_trial(ctx, project: str, log: str, pause: str | None, rng: random.Random) -> None:
    ready = ctx.Event()
    child = ctx.Process(target=worker.saver_loop, args=(project, log, ready, pause), daemon=True)
    child.start()
    assert ready.wait(timeout=60), "the child never reached its saving loop"
    if pause is None:
        import time

        time.sleep(rng.uniform(0.0, 0.15))
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL


def _check_after_kill(root: str, log: str) -> int | None:
    """No complete checkpoint lost; every visible checkpoint verifies. Returns the newest number."""
    complete = atomic.list_checkpoints(root)
    for _, path in complete:
        atomic.verify_checkpoint(path, checksums=True)
    numbers = [n for n, _ in complete]
    committed = [int(entry[1]) for entry in _log(log) if entry[0] == "committed"]
    if committed:
        # A save may have committed after the last log line (its rotation then removed an older
        # one), so the newest checkpoint is at least the last logged one, and with total_limit=2
        # the one before it must still be there: rotation only ever removes the third newest.
        newest = max(numbers)
        assert newest >= committed[-1], f"checkpoint {committed[-1]} was committed but is gone: {numbers}"
        if newest >= 1:
            assert numbers[-2:] == [newest - 1, newest], f"a complete checkpoint was lost: {numbers}"
    return max(numbers) if numbers else None


def _trials(tmp_path, pauses: list[str | None]) -> dict[str, int]:
    ctx = worker.forkserver_context()
    project = str(tmp_path / "run")
    root = os.path.join(project, "checkpoints")
    log = str(tmp_path / "log.txt")
    rng = random.Random(1234)
    expected_resume = None
    stats = {"trash_left": 0, "partial_left": 0}
    for pause in pauses:
        _run_trial(ctx, project, log, pause, rng)
        resumes = [entry for entry in _log(log) if entry[0] in ("resumed", "fresh")]
        last = resumes[-1]
        if expected_resume is None:
            assert last == ["fresh"]
        else:
            assert last == ["resumed", str(expected_resume), "ok"], last
        leftovers = os.listdir(root) if os.path.isdir(root) else []
        stats["trash_left"] += any(".trash-" in n for n in leftovers)
        stats["partial_left"] += any(n.endswith(".partial") for n in leftovers)
        expected_resume = _check_after_kill(root, log)
    # One more run checks that the state left by the last kill resumes too.
    _run_trial(ctx, project, log, "fsync", rng)
    resumed = [entry for entry in _log(log) if entry[0] in ("resumed", "fresh")][-1]
    assert resumed == ["resumed", str(expected_resume), "ok"], resumed
    return stats


def test_sigkill_during_save_30_trials(tmp_path) -> None:
    # 20 kills at random moments of the saving loop, 5 inside rotation's delete, 5 inside a flush.
    pauses = [None] * 20 + ["rmtree"] * 5 + ["fsync"] * 5
    random.Random(7).shuffle(pauses)
    stats = _trials(tmp_path, pauses)
    assert stats["trash_left"] >= 5 and stats["partial_left"] >= 5
