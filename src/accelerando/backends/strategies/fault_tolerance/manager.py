"""torchft's ``Manager`` for one replica group: its store, its lighthouse and its fault-tolerant process group.

Who calls this: :class:`~accelerando.backends.strategies.fault_tolerance.strategy.FaultTolerantStrategy`, once per
process, when the connector builds it. Every process of a replica group calls :func:`start_manager` at
the same point (several processes exchange the group's store port through the default process group).
Afterwards the manager's server (on the group's rank 0) heartbeats to the lighthouse until
:meth:`ManagerHandle.shutdown`, which runs at interpreter exit at the latest.

Every server a group starts listens on the job's bind address (loopback unless ``--bind_address``
names another, which needs ``--ft_insecure``: torchft's servers have no authentication): the group's
store, the manager's server (torchft binds it to every interface; :func:`_manager_server_bound_to`
rebinds it) and the checkpoint server (:class:`~.transport.WeightsOnlyTransport`, which loads a heal's
reply weights-only).
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import TCPStore  # pyright: ignore[reportPrivateImportUsage] - public in torch's docs
    from torchft import Manager

    from accelerando.plugins.fault_tolerance import FaultTolerancePlugin

from accelerando.backends.strategies.fault_tolerance.transport import WeightsOnlyTransport
from accelerando.core.listeners import (
    LOOPBACK,
    advertised_host,
    check_torchft_exposure,
    is_wildcard,
    store_server,
)

__all__ = ["DEFAULT_TIMEOUT_S", "ManagerHandle", "start_manager"]

#: Seconds a cross-group all-reduce, commit or weight transfer waits when no timeout is set (torchft's).
DEFAULT_TIMEOUT_S = 60.0


@dataclass
class ManagerHandle:
    """The manager of this replica group and the store it coordinates through.

    Attributes:
        manager: torchft's ``Manager``.
        store: the group's ``TCPStore`` (hosted by the group's rank 0).
    """

    manager: Manager
    store: TCPStore
    _closed: bool = False

    def shutdown(self) -> None:
        """Stop the manager's server and its threads (once; later calls do nothing)."""
        if not self._closed:
            self._closed = True
            self.manager.shutdown(wait=False)


def _require(plugin: FaultTolerancePlugin) -> tuple[str, int]:
    """The lighthouse address and replica id, or a ValueError naming how to give them."""
    if not plugin.lighthouse:
        raise ValueError(
            "fault tolerance needs a torchft lighthouse and none is known: launch with `accelerando launch "
            "--fault_tolerance` (which starts one), or give --ft_lighthouse http://host:port / "
            "FaultTolerancePlugin(lighthouse=...)"
        )
    if plugin.replica_id is None:
        raise ValueError(
            "fault tolerance needs this process's replica group number: launch with `accelerando launch "
            "--fault_tolerance --ft_replica_groups N`, or pass FaultTolerancePlugin(replica_id=...)"
        )
    return plugin.lighthouse, plugin.replica_id


def _group_store(group_rank: int, group_size: int, bind: str) -> TCPStore:
    """The replica group's own store: rank 0 hosts it on a free port of ``bind`` and tells the others."""
    import torch.distributed as dist

    store = store_server(bind, 0) if group_rank == 0 else None
    if group_size == 1:
        assert store is not None
        return store
    port = [store.port if store is not None else 0]
    dist.broadcast_object_list(port, src=0)
    # torch.distributed.TCPStore is public (documented) but re-exported from a C module pyright cannot see.
    client = dist.TCPStore  # pyright: ignore[reportPrivateImportUsage]
    return store if store is not None else client(advertised_host(bind), port[0], is_master=False)


@contextlib.contextmanager
def _manager_server_bound_to(bind: str) -> Iterator[None]:
    """While torchft's ``Manager`` is built, its ``ManagerServer`` listens on ``bind`` (torchft hard-codes ``[::]``).

    torchft builds it through its module's name (group rank 0 only); tests/engines/test_torchft_security.py
    fails if a torchft release changes that.
    """
    import torchft.manager as torchft_manager

    original = torchft_manager.ManagerServer
    host = "[::]" if is_wildcard(bind) else (f"[{bind}]" if ":" in bind else bind)

    def bound(*args: object, bind: str, **kwargs: object) -> object:
        # torchft's own arguments, passed through untouched: only ``bind`` is rewritten.
        return original(*args, bind=f"{host}:{bind.rsplit(':', 1)[1]}", **kwargs)  # pyright: ignore[reportArgumentType]

    torchft_manager.ManagerServer = bound  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        torchft_manager.ManagerServer = original


def start_manager(
    plugin: FaultTolerancePlugin,
    group_rank: int,
    group_size: int,
    bind_address: str | None = None,
    insecure: bool = False,
) -> ManagerHandle:
    """Create this process's torchft ``Manager`` (collective over the replica group's processes).

    Args:
        plugin: the filled :class:`~accelerando.plugins.fault_tolerance.FaultTolerancePlugin`.
        group_rank: this process's rank within its replica group.
        group_size: processes in the replica group.
        bind_address: where the group's servers listen (``--bind_address``); loopback when None.
        insecure: ``--ft_insecure``: the user accepts servers without authentication beyond loopback.

    Returns:
        The handle holding the manager and the group's store; shut down at interpreter exit.

    Raises:
        ValueError: no lighthouse address or no replica id is known, or the servers would listen
            beyond loopback without ``insecure`` (:func:`~accelerando.core.listeners.check_torchft_exposure`).
        ImportError: torchft is not installed (the message names the extra).
    """
    lighthouse, replica_id = _require(plugin)
    bind = bind_address or LOOPBACK
    check_torchft_exposure(bind, insecure)
    try:
        from torchft import Manager, ProcessGroupGloo
    except ImportError as err:
        raise ImportError(
            f"fault tolerance runs on torchft, which cannot be imported ({err}); install it with "
            "`pip install 'accelerando[torchft]'`"
        ) from err
    timeout = timedelta(seconds=plugin.timeout or DEFAULT_TIMEOUT_S)
    store = _group_store(group_rank, group_size, bind)
    # Other groups connect to the store, the manager and the checkpoint server at this address.
    host = advertised_host(bind)
    with _manager_server_bound_to(bind):
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=None,
            state_dict=None,
            min_replica_size=plugin.min_replicas or 1,
            use_async_quorum=plugin.use_async_quorum,
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timeout,
            rank=group_rank,
            world_size=group_size,
            store_addr=host,
            store_port=store.port,
            lighthouse_addr=lighthouse,
            # torchft numbers the group's processes from the digits that end the replica id.
            replica_id=f"accelerando_{replica_id}",
            port=0,
            hostname=host,
            # A heal's reply is loaded weights-only, from a server on the bind address.
            checkpoint_transport=WeightsOnlyTransport(bind, timeout),  # type: ignore[arg-type]
            init_sync=plugin.init_sync,
        )
    handle = ManagerHandle(manager, store)
    atexit.register(handle.shutdown)
    return handle
