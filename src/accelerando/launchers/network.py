"""Facts about this machine's network that a launch on several machines needs, read at run time.

A machine's host name often resolves to a loopback address (Debian's ``127.0.1.1 <hostname>`` line in
``/etc/hosts``, containers, network namespaces). PyTorch then advertises what other machines cannot
reach: the elastic agent names its workers' store after the fully qualified host name (``localhost``)
and gloo listens on the host name's address (loopback). The launcher instead uses the address this
machine reaches machine 0 from (:func:`route_source`) and the interface that holds it
(:func:`interface_of`).

Who calls it: :mod:`accelerando.launchers.bound_rendezvous` (the agent's own address) and
:mod:`accelerando.launchers.runner` (gloo's interface for the processes). Nothing here sends a packet:
a UDP socket's ``connect`` only asks the kernel for the route.
"""

from __future__ import annotations

import socket
import sys

__all__ = ["gloo_interface", "interface_of", "is_local_address", "route_source"]

# Linux's ioctl that reads an interface's IPv4 address (linux/sockios.h).
_SIOCGIFADDR = 0x8915


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def is_local_address(address: str) -> bool:
    """Whether ``address`` is one of this machine's: a socket can bind it.

    Unlike a comparison with the addresses the host name resolves to, this sees every interface's
    address (a second network card, a container's or a network namespace's own address).

    Args:
        address: an IP address or a host name (resolved by the bind).

    Returns:
        True when a TCP socket binds ``(address, 0)``; False otherwise (never raises).
    """
    try:
        with socket.socket(_family(address), socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def route_source(host: str, port: int) -> str | None:
    """This machine's address on the route to ``host`` (what a connection to it would come from).

    Args:
        host: machine 0's address (``--main_process_ip``) or a name that resolves to it.
        port: its port (only completes the socket address; no packet is sent).

    Returns:
        The local IP address, or None when there is no route (or the name does not resolve).
    """
    try:
        with socket.socket(_family(host), socket.SOCK_DGRAM) as probe:
            probe.connect((host, port or 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def interface_of(address: str) -> str | None:
    """The name of the network interface whose (primary IPv4) address is ``address``, on Linux.

    Args:
        address: an IPv4 address of this machine.

    Returns:
        The interface name (``eth0``), or None (another system, IPv6, or no interface holds it).
    """
    if not sys.platform.startswith("linux") or ":" in address:
        return None
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _index, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # an interface without an IPv4 address
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def _host_name_reaches_out() -> bool:
    """Whether this machine's host name resolves to an address of this machine that is not loopback.

    gloo listens there; otherwise (loopback only, an address of another network namespace, or no
    answer) it falls back to loopback.
    """
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    addresses = {str(info[4][0]) for info in infos}
    return any(not _is_loopback(address) and is_local_address(address) for address in addresses)


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def gloo_interface(main_host: str, main_port: int) -> str | None:
    """The interface gloo should listen on in a job of several machines, when its own choice is wrong.

    gloo listens on the address the host name resolves to, or on loopback when that address is not
    one of this machine's; then the processes on other machines cannot reach it and the job hangs in
    its first collective. The interface this machine reaches machine 0 through is the right one.

    Args:
        main_host: machine 0's address (``--main_process_ip``).
        main_port: its port.

    Returns:
        The interface name for ``GLOO_SOCKET_IFNAME``, or None when gloo's own choice is fine (the
        host name resolves to an address of this machine other than loopback) or no interface is found.
    """
    if _host_name_reaches_out():
        return None
    source = route_source(main_host, main_port)
    if source is None or _is_loopback(source):
        return None
    return interface_of(source)
