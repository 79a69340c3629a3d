"""Restart the survivors when a machine of a dynamic rendezvous goes silent.

PyTorch's elastic agent restarts its processes when one of them fails, or when a new machine waits to
join (``RendezvousHandler.num_nodes_waiting() > 0``, asked every ``--monitor_interval`` while the
processes are healthy). A machine that *disappears* is noticed by neither when its processes hang
instead of failing: a network link that goes down leaves every collective waiting for its peer until
the process group's timeout (30 minutes by default), although the rendezvous already knows, from the
missing keep-alives, that the machine is gone.

:func:`watch_members` closes that gap on the c10d backend: the handler remembers the machines of the
round it completed, and ``num_nodes_waiting`` also answers 1 when one of them was dropped for missing
keep-alives (after ``keep_alive_interval`` x ``keep_alive_max_attempt`` seconds, torch's own rule) or
left, or when a new round began without this machine. The agent then stops its processes and meets
the machines left in a new round, as for a machine that joins; such a restart does not count against
``--max_restarts``.

Who calls it: :func:`accelerando.launchers.bound_rendezvous` when it creates the c10d handler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousInfo
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

__all__ = ["watch_members"]


def _members(handler: DynamicRendezvousHandler) -> tuple[int, frozenset[object], bool]:
    # torch 2.13: dynamic_rendezvous.py (private; the state synced from the backend, dead nodes dropped)
    state = handler._state_holder.state
    return state.round, frozenset(state.participants), bool(state.closed)


def _forget_workers_store(handler: DynamicRendezvousHandler) -> None:
    """Make each round bootstrap its processes from a new store, hosted by that round's rank 0.

    torch keeps the first round's store across rounds: a machine that is not rank 0 would send its
    processes to the store of a rank 0 that is gone (the machine that died), and a process of the new
    round would read the addresses the previous round's processes left under the same restart count.
    """
    # torch 2.13: dynamic_rendezvous.py (private; the cached store server and where it is advertised)
    if hasattr(handler, "_bootstrap_store_info"):
        handler._shared_tcp_store_server = None
        handler._bootstrap_store_info = None


def watch_members(handler: DynamicRendezvousHandler) -> DynamicRendezvousHandler:
    """Make ``handler`` ask its agent for a new round when a machine of the current round is gone.

    Args:
        handler: a c10d (dynamic) rendezvous handler, before the agent's first rendezvous.

    Returns:
        The same handler; its ``next_rendezvous`` starts each round with a new workers' store
        (:func:`_forget_workers_store`) and records the round's machines; its
        ``num_nodes_waiting`` answers at least 1 while one of them is missing (see the module
        docstring). A closed rendezvous (the job is ending) never asks for a new round.
    """
    joined: dict[str, tuple[int, frozenset[object]]] = {}
    next_rendezvous = handler.next_rendezvous
    num_nodes_waiting = handler.num_nodes_waiting

    def next_rendezvous_recorded() -> RendezvousInfo:
        _forget_workers_store(handler)
        info = next_rendezvous()
        current, nodes, _closed = _members(handler)
        joined["round"] = (current, nodes)
        return info

    def waiting_or_gone() -> int:
        waiting = num_nodes_waiting()  # syncs the state (at most once a second) and drops silent machines
        if not joined:
            return waiting
        current, nodes, closed = _members(handler)
        round_joined, nodes_joined = joined["round"]
        gone = current != round_joined or not nodes_joined <= nodes
        return max(waiting, 1) if gone and not closed else waiting

    handler.next_rendezvous = next_rendezvous_recorded  # type: ignore[method-assign]
    handler.num_nodes_waiting = waiting_or_gone  # type: ignore[method-assign]
    return handler
