"""The elastic agent's rendezvous stores, bound to the launch's address instead of every interface.

torch's ``static`` and ``c10d`` rendezvous handlers create their ``TCPStore`` servers with torch's
default, which listens on every interface even when the endpoint is ``127.0.0.1``: anyone on the
network could read, write or stall the job's keys, and the ``c10d`` backend unpickles the rendezvous
state it reads from its store (a value written from another machine ran code in the launcher).

:func:`bound_rendezvous` replaces both handlers, for the time the agent runs in this process
(``accelerando launch``, ``notebook_launcher``), by the same handlers whose servers listen on the
launch's bind address only (:func:`accelerando.core.listeners.store_server`): loopback on one machine,
the address the user named on several. Who calls it: :mod:`accelerando.launchers.runner` and
:mod:`accelerando.launchers.notebook`, around the agent's run. Afterwards torch's handlers are back.

The c10d handler also works across machines where torch's does not: it hosts the store where the
endpoint is an address a socket can bind (torch compares host names only, which misses a second
network card's or a network namespace's address), names its agent by its address on the route to the
endpoint instead of the host name (often ``localhost``), and restarts the survivors without a machine
that went silent (:mod:`accelerando.launchers.member_watch`).

torch's registry refuses a second creator under a taken name, so the entries of its table are
swapped (``rendezvous_handler_registry._registry``); tests/launchers/test_listeners.py fails if a
torch release changes that table or the handlers' constructors.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from accelerando.core.listeners import is_loopback, is_wildcard, store_server
from accelerando.launchers.member_watch import watch_members
from accelerando.launchers.network import is_local_address, route_source

if TYPE_CHECKING:
    from torch.distributed import Store  # pyright: ignore[reportPrivateImportUsage]
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters

__all__ = ["bound_rendezvous"]


def _static_handler(bind: str, params: RendezvousParameters) -> RendezvousHandler:
    """The static handler of torch, whose store (hosted by machine 0's agent) listens on ``bind`` only."""
    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static

    class BoundStatic(static.StaticTCPRendezvous):
        def next_rendezvous(self):  # noqa: ANN202 - torch's signature
            if self._store is None and self.rank == 0:
                self._store = store_server(
                    bind,
                    self.master_port,
                    world_size=self.world_size,
                    timeout=self.timeout,
                    wait_for_workers=True,
                    multi_tenant=True,
                )
            return super().next_rendezvous()

    handler = static.create_rdzv_handler(params)
    assert isinstance(handler, static.StaticTCPRendezvous)
    return BoundStatic(
        handler.master_addr,
        handler.master_port,
        handler.rank,
        handler.world_size,
        handler.run_id,
        int(handler.timeout.total_seconds()),
    )


def _c10d_store(bind: str, params: RendezvousParameters) -> Store:
    """The c10d backend's store: hosted (on ``bind``) when this machine is the endpoint's, else a client."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d

    # torch 2.13: torch/distributed/elastic/rendezvous/utils.py:117 (private; is the endpoint this machine?)
    from torch.distributed.elastic.rendezvous.utils import (
        _matches_machine_hostname,
        parse_rendezvous_endpoint,
    )

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=c10d.DEFAULT_PORT)
    configured = params.get_as_bool("is_host")
    # torch compares the endpoint with the addresses of the host name only; an address of another
    # interface (a second card, a network namespace) is this machine's too when a socket can bind it.
    is_host = (
        configured if configured is not None else _matches_machine_hostname(host) or is_local_address(host)
    )
    timeout = timedelta(seconds=int(params.get_as_int("read_timeout", 60) or 60))
    if is_host:
        try:
            return store_server(bind, port, timeout=timeout, multi_tenant=True)
        except OSError:
            # Another agent on this machine hosts it (several agents of one job): connect, as torch does.
            if configured is not None:
                raise
    return dist.TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)  # pyright: ignore[reportPrivateImportUsage]


def _advertise_route_source(params: RendezvousParameters) -> None:
    """Without ``--local_addr``, this agent names itself by its address on the route to the endpoint.

    torch's default is the fully qualified host name, which on many machines (and in every network
    namespace of one host) is ``localhost``: the workers of other machines, told to bootstrap from
    the store of the agent that ranks first, would then look for it on their own machine.
    """
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if params.local_addr:
        return
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    if is_loopback(host):
        return
    source = route_source(host, port)
    if source is not None and not is_loopback(source):
        params.local_addr = source


def _c10d_handler(bind: str, params: RendezvousParameters) -> RendezvousHandler:
    """The c10d (dynamic) handler of torch, with its two stores bound: the rendezvous one and the workers' one."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    if params.get("store_type", "tcp").strip().lower() != "tcp":  # a file store listens on nothing
        backend, store = c10d.create_backend(params)
        return watch_members(create_handler(store, backend, params))
    _advertise_route_source(params)
    store = _c10d_store(bind, params)
    handler = create_handler(store, c10d.C10dRendezvousBackend(store, params.run_id), params)

    def workers_store(address: str, port: int) -> Store:
        # The store the workers bootstrap from, hosted by rank 0's agent and advertised at ``address``
        # (``--local_addr``: loopback on one machine, else this machine's host name).
        where = bind if is_wildcard(bind) or is_loopback(bind) else address
        return store_server(where, port, multi_tenant=True)

    handler._create_tcp_store_server = workers_store  # type: ignore[method-assign]
    return watch_members(handler)  # a machine that goes silent restarts the others without it


@contextlib.contextmanager
def bound_rendezvous(bind: str) -> Iterator[None]:
    """Within the block, the ``static`` and ``c10d`` rendezvous stores listen on ``bind`` only.

    Args:
        bind: the launch's bind address (:attr:`accelerando.launchers.plan.LaunchPlan.bind_address`).

    Yields:
        Nothing; torch's handlers are restored on exit, whatever happened.
    """
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry

    # torch 2.13: torch/distributed/elastic/rendezvous/api.py:338 (private; the handlers by backend name)
    table = registry._registry
    saved = {name: table.get(name) for name in ("static", "c10d")}
    table["static"] = functools.partial(_static_handler, bind)
    table["c10d"] = functools.partial(_c10d_handler, bind)
    try:
        yield
    finally:
        for name, creator in saved.items():
            if creator is None:
                table.pop(name, None)
            else:
                table[name] = creator


def main(argv: list[str] | None = None) -> None:
    """``python -m accelerando.launchers.bound_rendezvous BIND ARGS...``: torchrun ARGS with bound stores.

    How a fault-tolerant launch starts a replica group of several processes (each group is its own
    elastic job, run in its own process: :mod:`accelerando.launchers.ft`).

    Args:
        argv: the bind address, then ``torch.distributed.run``'s arguments (default: ``sys.argv[1:]``).
    """
    import sys

    from torch.distributed.run import main as torchrun

    args = sys.argv[1:] if argv is None else argv
    with bound_rendezvous(args[0]):
        torchrun(args[1:])


if __name__ == "__main__":
    main()
