"""Facts about this machine that launch checks need, read without importing torch.

The launcher must decide how many processes to start before any process imports torch, so GPU and
CPU counts are read from the driver's ``/proc`` entries and the environment.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from accelerando.core.devices.counting import visible_gpu_count

__all__ = ["SOCKET_IFNAME_ENV", "MachineInfo", "detect_machine", "visible_gpu_count", "free_port"]


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What the launch plan needs to know about the machine it runs on.

    Attributes:
        gpu_count: GPUs visible to processes started here.
        cpu_count: CPU cores usable by this process.
        python: the interpreter that runs the script.
        omp_threads_set: ``OMP_NUM_THREADS`` is already set by the user (then it is left alone).
        loopback_interface: the name of the loopback network interface (``lo`` on Linux), or None
            when unknown; a one-machine job's gloo and NCCL sockets are bound to it.
        interfaces_chosen: the ``*_SOCKET_IFNAME`` variables the user set (then they are left alone).
    """

    gpu_count: int = 0
    cpu_count: int = 1
    python: str = sys.executable
    omp_threads_set: bool = False
    loopback_interface: str | None = None
    interfaces_chosen: tuple[str, ...] = ()


#: Variables that choose the network interface of gloo's and NCCL's sockets.
SOCKET_IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _loopback_interface() -> str | None:
    # Linux names it lo (one stat, no socket import on the launcher's start-up path); elsewhere unknown.
    return "lo" if os.path.isdir("/sys/class/net/lo") else None


def detect_machine() -> MachineInfo:
    """Describe this machine for :func:`accelerando.launchers.plan.build`.

    Returns:
        A :class:`MachineInfo` with the visible GPU count and usable CPU count.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return MachineInfo(
        gpu_count=visible_gpu_count(),
        cpu_count=cpus,
        python=sys.executable,
        omp_threads_set=bool(os.environ.get("OMP_NUM_THREADS")),
        loopback_interface=_loopback_interface(),
        interfaces_chosen=tuple(name for name in SOCKET_IFNAME_ENV if os.environ.get(name)),
    )


def free_port() -> int:
    """Return a TCP port that was free on the loopback interface a moment ago."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
