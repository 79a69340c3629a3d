"""Ports on this machine: whether one is taken, and a free one (the reference's ``utils.other`` helpers)."""

from __future__ import annotations

import socket

from accelerando.core.settings.machine import free_port

__all__ = ["get_free_port", "is_port_in_use"]

_DEFAULT_MAIN_PORT = 29500


def is_port_in_use(port: int | None = None) -> bool:
    """Tell whether something already listens on ``port`` of this machine's loopback interface.

    The launcher asks this before starting a job on the default rendezvous port.

    Args:
        port: the TCP port; ``None`` checks the default main-process port, 29500.

    Returns:
        True when a connection to ``127.0.0.1:port`` is accepted.
    """
    if port is None:
        port = _DEFAULT_MAIN_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", int(port))) == 0


def get_free_port() -> int:
    """Return a TCP port that was free on this machine a moment ago (for a rendezvous).

    Returns:
        A port number chosen by the operating system.
    """
    return free_port()
