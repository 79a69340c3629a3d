"""The thread pools of checkpoint work that releases the GIL.

- :func:`pool`: hashing file pieces, copying tensors. One pool per process, with a thread per usable
  core (at most ``MAX_THREADS``): the work it runs is bound by memory bandwidth, and a load or a
  verification is one-time work that should not be held to one core by ``OMP_NUM_THREADS=1``, which
  launchers set whether a machine runs one process or several.
- :func:`flush_pool`: ``fsync`` calls and unlinks, which wait on the disk rather than use a core. A
  durable save flushes all its files (and folders) at once on it, so that the file system commits them
  together (one journal commit for many files on ext4 and XFS) instead of one after the other. Its
  threads are all started with it: no save after the first one starts a thread.

Both pools keep their threads between saves.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

__all__ = [
    "FLUSH_THREADS",
    "FixedPool",
    "MAX_THREADS",
    "copy_threads",
    "flush_pool",
    "pool",
    "threads_for_copies",
    "usable_cores",
]

MAX_THREADS = 8
# fsync calls run at once: they wait on the disk, so more of them than cores is what batches them.
FLUSH_THREADS = 8

_R = TypeVar("_R")

_POOLS: dict[int, ThreadPoolExecutor] = {}


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system reports it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pool() -> ThreadPoolExecutor:
    """This process's pool (a forked child inherits the parent's pool object but not its threads, so
    it gets a pool of its own).
    """
    pid = os.getpid()
    found = _POOLS.get(pid)
    if found is None:
        found = ThreadPoolExecutor(
            max_workers=max(1, min(MAX_THREADS, usable_cores())), thread_name_prefix="accelerando-checkpoint"
        )
        _POOLS.clear()
        _POOLS[pid] = found
    return found


class FixedPool:
    """``FLUSH_THREADS`` daemon threads, all started with the pool, running submitted calls in order.

    Unlike a ``ThreadPoolExecutor``, which starts a thread whenever none is idle at the moment of a
    submission, it never starts one after its creation: the first save starts them, no later one does.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._work: queue.SimpleQueue[tuple[Future[object], Callable[..., object], tuple[object, ...]]]
        self._work = queue.SimpleQueue()
        for i in range(threads):
            threading.Thread(target=self._run, name=f"{name}_{i}", daemon=True).start()

    def submit(self, function: Callable[..., _R], *args: object) -> Future[_R]:
        """Run ``function(*args)`` on a thread of the pool; its result or error in the returned future."""
        future: Future[_R] = Future()
        self._work.put((future, function, args))  # pyright: ignore[reportArgumentType]
        return future

    def _run(self) -> None:
        while True:
            future, function, args = self._work.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = function(*args)
            except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(err)
            else:
                future.set_result(result)


_FLUSH_POOLS: dict[int, FixedPool] = {}


def flush_pool() -> FixedPool:
    """This process's pool of ``fsync`` calls and other calls that wait on the disk (a forked child
    gets a pool of its own).
    """
    pid = os.getpid()
    found = _FLUSH_POOLS.get(pid)
    if found is None:
        found = FixedPool(FLUSH_THREADS, "accelerando-fsync")
        _FLUSH_POOLS.clear()
        _FLUSH_POOLS[pid] = found
    return found


def copy_threads() -> int:
    """The threads a load's copies may use: this process's share of the usable cores (the processes
    the cluster environment places on this machine share them), at most ``MAX_THREADS``, at least 1.
    """
    from accelerando.core.runtime import current_process

    process = current_process()
    local_processes = max(1, process.cluster.local_world_size) if process is not None else 1
    return max(1, min(MAX_THREADS, usable_cores() // local_processes))


@contextmanager
def threads_for_copies() -> Iterator[None]:
    """Within the block, torch's intra-op threads are at least :func:`copy_threads`, then back as they
    were.

    For copies torch makes itself (``load_state_dict`` into a module's parameters, the optimizer's
    state): a launcher's ``OMP_NUM_THREADS=1`` would otherwise have a process alone on its machine
    copy on one core.
    """
    import torch

    before = torch.get_num_threads()
    wanted = copy_threads()
    if before >= wanted:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(before)
