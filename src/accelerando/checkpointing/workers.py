"""The thread pool of checkpoint work that releases the GIL: hashing file pieces, copying tensors.

One pool per process, with a thread per usable core (at most ``MAX_THREADS``): the work it runs is
bound by memory bandwidth, and a load or a verification is one-time work that should not be held to
one core by ``OMP_NUM_THREADS=1``, which launchers set whether a machine runs one process or several.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

__all__ = ["MAX_THREADS", "copy_threads", "pool", "threads_for_copies", "usable_cores"]

MAX_THREADS = 8

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
