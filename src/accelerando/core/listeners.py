"""Where the sockets a job listens on are bound: loopback unless the user names an address.

Every listener a launch opens (the rendezvous store, the torchft lighthouse, managers and checkpoint
servers) goes through :func:`listen_address`: on one machine it is loopback (``127.0.0.1``), reachable
only from this machine; on several machines it is the address the user named (``--main_process_ip``,
or ``--bind_address`` when the listeners must bind another address). The wildcard (``0.0.0.0``,
``::``: every interface) is used only when the user writes it.

torch's ``TCPStore`` server binds every interface, whatever host name it is given; it accepts a
listening socket made by its caller (``master_listen_fd``), which is how :func:`store_server` binds it
to one address.

Nothing is imported at module level (the launcher's start-up imports this module): ``socket`` and
``ipaddress`` load when an address is checked or bound, torch in :func:`store_server`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ipaddress
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore  # pyright: ignore[reportPrivateImportUsage] - public in torch's docs

__all__ = [
    "LOOPBACK",
    "WILDCARDS",
    "advertised_host",
    "check_torchft_exposure",
    "is_loopback",
    "is_wildcard",
    "listen_address",
    "listening_socket",
    "store_server",
]

#: The address a one-machine job's listeners bind.
LOOPBACK = "127.0.0.1"
#: Addresses that mean "every interface": bound only when the user writes one of them.
WILDCARDS = ("0.0.0.0", "::", "[::]", "*", "")


def _literal(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    import ipaddress

    try:
        return ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None


def is_wildcard(address: str) -> bool:
    """Whether ``address`` means every interface (``0.0.0.0``, ``::``, ``*`` or empty)."""
    return address.strip() in WILDCARDS


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP literal or ``localhost``) is reachable only from this machine."""
    if address.strip().lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    literal = _literal(address.strip())
    return literal is not None and literal.is_loopback


def listen_address(bind_address: str | None, main_address: str | None) -> str:
    """The address a job's listeners bind: ``bind_address`` when given, else the rendezvous host, else loopback.

    Args:
        bind_address: the user's ``--bind_address`` (``bind_address`` setting), or None.
        main_address: the address of machine 0 the processes connect to (``--main_process_ip``), or None
            on one machine.

    Returns:
        The address to bind (``127.0.0.1`` when neither is given).
    """
    for address in (bind_address, main_address):
        if address is not None and address.strip() != "":
            return address.strip()
    return LOOPBACK


def advertised_host(bind: str) -> str:
    """The host other processes should connect to for a listener bound to ``bind``.

    The bound address itself, except for the wildcard, where this machine's host name is advertised
    (as torch and torchft do).
    """
    import socket

    return socket.gethostname() if is_wildcard(bind) else bind.strip("[]")


def check_torchft_exposure(bind: str, insecure: bool) -> None:
    """Refuse to let torchft's servers listen beyond this machine unless the user accepted the risk.

    Args:
        bind: the address the servers would bind.
        insecure: ``--ft_insecure`` (setting ``ft_insecure``).

    Raises:
        ValueError: ``bind`` is not loopback and ``insecure`` is not set; the message names the risk and the flag.
    """
    if is_loopback(bind) or insecure:
        return
    raise ValueError(
        f"fault tolerance would let torchft's lighthouse, managers and checkpoint servers listen on {bind}, where "
        "other machines reach them, and they have no authentication: anyone who reaches them can list the "
        "replicas, stop a training process, join the quorum to stall the job or feed it other weights, and read "
        "the model's weights during a heal. Fix: keep the default (127.0.0.1: the groups of one machine), or pass "
        "--ft_insecure (ft_insecure: true) on a network where every machine is trusted"
    )


def listening_socket(address: str, port: int = 0, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``address``:``port`` and listening.

    Args:
        address: an IP literal, a host name (its first address is bound) or a wildcard (every interface).
        port: the port; 0 picks a free one.
        backlog: the listen queue length.

    Returns:
        The listening socket (the caller owns it).

    Raises:
        OSError: the address is not one of this machine's, or the port is taken.
    """
    import socket

    host = address.strip("[]")
    if is_wildcard(address):
        host = "::" if socket.has_ipv6 and address.strip() in ("::", "[::]") else "0.0.0.0"
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, where = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def store_server(
    address: str,
    port: int = 0,
    *,
    world_size: int | None = None,
    timeout: timedelta | None = None,
    wait_for_workers: bool = False,
    multi_tenant: bool = False,
) -> TCPStore:
    """A ``TCPStore`` server that listens on ``address`` only (torch's own binds every interface).

    Args:
        address: where to listen (see :func:`listening_socket`).
        port: the port; 0 picks a free one (the store's ``port`` says which).
        world_size: clients the server waits for when ``wait_for_workers``.
        timeout: the store's operation timeout (torch's default, 300 s, when None).
        wait_for_workers: block until ``world_size`` clients connected.
        multi_tenant: as torch's ``TCPStore(multi_tenant=...)``.

    Returns:
        The server store (the listening socket is handed to it: it closes it).

    Raises:
        OSError: the address cannot be bound (not this machine's, or the port is taken).
    """
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    sock = listening_socket(address, port)
    bound_port = int(sock.getsockname()[1])
    fd = sock.detach()  # the store owns the descriptor from here on
    store_class = dist.TCPStore  # pyright: ignore[reportPrivateImportUsage]
    try:
        return store_class(
            advertised_host(address),
            bound_port,
            world_size,
            True,
            timeout if timeout is not None else timedelta(seconds=300),
            wait_for_workers=wait_for_workers,
            multi_tenant=multi_tenant,
            master_listen_fd=fd,
        )
    except BaseException:
        socket.close(fd)
        raise
