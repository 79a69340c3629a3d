"""The thread pool of checkpoint work that releases the GIL: hashing file pieces, copying tensors.

One pool per process, with a thread per usable core (at most ``MAX_THREADS``): the work it runs is
bound by memory bandwidth, and a load or a verification is one-time work that should use every
core whatever ``OMP_NUM_THREADS`` says (launchers set it to 1 for each of several processes).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

__all__ = ["MAX_THREADS", "every_core_for_copies", "pool", "usable_cores"]

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


@contextmanager
def every_core_for_copies() -> Iterator[None]:
    """Within the block, torch's intra-op threads are at least the pool's size, then back as they were.

    For copies torch makes itself (``load_state_dict`` into a module's parameters), which the pool
    cannot split: a launcher's ``OMP_NUM_THREADS=1`` would otherwise copy on one core.
    """
    import torch

    before = torch.get_num_threads()
    wanted = max(1, min(MAX_THREADS, usable_cores()))
    if before >= wanted:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(before)
