"""The TCP sockets a running job listens on, read from /proc (Linux): which addresses other machines reach.

A job is a process and all its descendants. Each listening socket in ``/proc/net/tcp`` and
``/proc/net/tcp6`` is matched to the processes holding it through the ``socket:[inode]`` links of
``/proc/<pid>/fd``. Used by tests/launchers/test_listeners.py and tests/engines/test_torchft_security.py.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

__all__ = ["Listener", "job_pids", "listeners", "non_loopback"]

_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    """One listening socket: the process holding it, its command name, the bound address and port."""

    pid: int
    command: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach it (127.0.0.0/8, ::1, or an IPv4-mapped loopback)."""
        address = ipaddress.ip_address(self.address)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.command}(pid {self.pid}) listens on {host}:{self.port}"


def job_pids(root: int) -> set[int]:
    """``root`` and every process descending from it, alive now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _listening_inodes() -> dict[int, tuple[str, int]]:
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != _LISTEN:
                continue
            hex_address, hex_port = fields[1].split(":")
            inodes[int(fields[9])] = (_address(hex_address), int(hex_port, 16))
    return inodes


def listeners(pids: set[int]) -> list[Listener]:
    """Every listening TCP socket held by one of ``pids`` (each socket once per process holding it)."""
    inodes = _listening_inodes()
    found = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
                command = comm.read().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # exited meanwhile
        held = set()
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile (the listing's own descriptor, when pid is this process)
            if link.startswith("socket:["):
                held.add(int(link[8:-1]))
        found += [Listener(pid, command, *inodes[inode]) for inode in sorted(held & inodes.keys())]
    return found


def non_loopback(found: list[Listener]) -> list[Listener]:
    """The listeners other machines can reach."""
    return [listener for listener in found if not listener.loopback]
