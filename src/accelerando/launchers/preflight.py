"""Check the rendezvous address and port before a multi-process launch starts its processes.

A wrong ``--main_process_ip`` or a port another program holds otherwise shows up as a launch that
waits for peers that never come (up to the rendezvous timeout), or as a deep traceback from every
process. The checks here take at most a few seconds and fail with one line naming the host or port
and the fix:

- the rendezvous host must resolve within :data:`RESOLVE_TIMEOUT_S` (asked again meanwhile: the name
  of a pod's service appears a moment after the pod starts);
- on machine 0 of a static rendezvous, which hosts it, the port must be free;
- on the other machines, machine 0 must not be unreachable (a refused connection is fine: machine 0
  may simply not have started yet).

With a dynamic rendezvous backend (``c10d``, ``etcd``) the backend waits for its host and retries by
itself, so a host that does not resolve yet is only a warning there.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelerando.launchers.network import gloo_interface, is_local_address

if TYPE_CHECKING:
    from accelerando.launchers.plan import LaunchPlan

__all__ = [
    "RESOLVE_TIMEOUT_S",
    "Rendezvous",
    "RendezvousError",
    "check_plan",
    "check_rendezvous",
    "rendezvous_of",
    "socket_interfaces",
]

#: Seconds a host name may take to resolve (asked again meanwhile) before the check gives up on it.
RESOLVE_TIMEOUT_S = 5.0
#: Seconds a probe connection to machine 0 may take.
CONNECT_TIMEOUT_S = 2.0
_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH}
_RETRY_S = 0.5


class RendezvousError(ValueError):
    """The rendezvous address or port cannot work; the message names it and the fix."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the machines of a launch meet.

    Attributes:
        host: the rendezvous host (``--main_process_ip``).
        port: its port (``--main_process_port``).
        machine_rank: this machine's rank.
        num_machines: machines in the launch.
        backend: the rendezvous backend (``static``, ``c10d``, ``etcd``, ...).
    """

    host: str
    port: int
    machine_rank: int = 0
    num_machines: int = 1
    backend: str = "static"


def _option(argv: Sequence[str], name: str) -> str | None:
    for i, token in enumerate(argv[:-1]):
        if token == name:
            return argv[i + 1]
    return None


def rendezvous_of(agent_args: Sequence[str]) -> Rendezvous | None:
    """Read the rendezvous from the ``torch.distributed.run`` arguments of an elastic launch plan.

    Args:
        agent_args: :attr:`accelerando.launchers.plan.LaunchPlan.agent_args`.

    Returns:
        The :class:`Rendezvous`, or ``None`` when the arguments name no host and port.
    """
    backend = _option(agent_args, "--rdzv_backend") or "static"
    if backend == "static":
        host, port = _option(agent_args, "--master_addr"), _option(agent_args, "--master_port")
    else:
        endpoint = _option(agent_args, "--rdzv_endpoint") or ""
        host, _, port = endpoint.rpartition(":")
    if not host or not port or not port.isdigit():
        return None
    return Rendezvous(
        host=host.strip("[]"),
        port=int(port),
        machine_rank=int(_option(agent_args, "--node_rank") or 0),
        num_machines=int((_option(agent_args, "--nnodes") or "1").split(":")[-1]),
        backend=backend,
    )


def _resolve(host: str, timeout: float) -> list[str]:
    """The addresses of ``host``; raises OSError (or TimeoutError) when it does not resolve in time."""
    found: dict[str, object] = {}

    def lookup() -> None:
        try:
            found["infos"] = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as err:
            found["error"] = err

    # getaddrinfo cannot be interrupted; a daemon thread lets the check return while a slow DNS answers.
    worker = threading.Thread(target=lookup, daemon=True, name="accelerando-resolve")
    worker.start()
    worker.join(timeout)
    infos = found.get("infos")
    if isinstance(infos, list):
        return list(dict.fromkeys(info[4][0] for info in infos))
    error = found.get("error")
    if isinstance(error, OSError):
        raise error
    raise TimeoutError(f"no answer within {timeout:g} s (is the name server reachable?)")


def _resolve_within(host: str, budget: float, resolve: Callable[[str, float], list[str]]) -> list[str]:
    """Resolve ``host``, asking again while ``budget`` seconds last: a starting cluster's names (a pod's
    service) appear a moment after the machine that needs them; a name that never appears fails then.
    """
    deadline = time.monotonic() + budget
    while True:
        try:
            return resolve(host, max(deadline - time.monotonic(), 0.1))
        except TimeoutError:
            raise
        except OSError:
            if time.monotonic() + _RETRY_S >= deadline:
                raise
            time.sleep(_RETRY_S)


def _port_in_use(port: int) -> OSError | None:
    """Bind the port on every interface as the rendezvous store does; the error when that fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as err:
            return err
    return None


def _connect_error(address: str, port: int, timeout: float) -> OSError | None:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect((address, port))
        except OSError as err:
            return err
    return None


def check_rendezvous(
    rdzv: Rendezvous,
    *,
    resolve_timeout: float = RESOLVE_TIMEOUT_S,
    connect_timeout: float = CONNECT_TIMEOUT_S,
    resolve: Callable[[str, float], list[str]] = _resolve,
) -> list[str]:
    """Check that the launch can meet at ``rdzv``.

    Args:
        rdzv: the rendezvous of the launch.
        resolve_timeout: seconds the host name may take to resolve; a name that does not resolve is
            asked for again until then (a cluster's names may appear a moment late).
        connect_timeout: seconds a probe connection to machine 0 may take (machines other than 0).
        resolve: resolves a host name to addresses (a test passes a fake).

    Returns:
        Warnings for the user (e.g. machine 0's address is not one of this machine's).

    Raises:
        RendezvousError: the host does not resolve (static rendezvous), the port is taken on machine 0,
            or machine 0 is unreachable; the message names the host or port and the fix.
    """
    where = f"{rdzv.host}:{rdzv.port}"
    warnings: list[str] = []
    try:
        addresses = _resolve_within(rdzv.host, resolve_timeout, resolve)
    except OSError as err:
        reason = err.strerror or str(err)
        message = (
            f"the rendezvous host {rdzv.host!r} (--main_process_ip) does not resolve: {reason}. Fix: pass the "
            f"IP address or a name of machine 0 that every machine resolves (check with `getent hosts {rdzv.host}`)."
        )
        if rdzv.backend != "static":  # the backend keeps trying; the name may appear (a starting pod's)
            return [message.replace("Fix:", f"The {rdzv.backend} rendezvous retries; if it times out:")]
        raise RendezvousError(message) from None
    if rdzv.machine_rank == 0 and rdzv.backend == "static":  # this machine hosts the rendezvous store
        if not any(is_local_address(address) for address in addresses):
            warnings.append(
                f"machine_rank 0 hosts the rendezvous, but {rdzv.host!r} ({', '.join(addresses)}) is not an "
                "address of this machine; if this is not machine 0, pass its own --machine_rank"
            )
        if (busy := _port_in_use(rdzv.port)) is not None:
            if busy.errno == errno.EADDRINUSE:
                raise RendezvousError(
                    f"port {rdzv.port} (--main_process_port) is already in use on this machine, which hosts the "
                    f"rendezvous at {where} as machine_rank 0 (another launch or program holds it: "
                    f"`ss -ltnp 'sport = :{rdzv.port}'` shows which). Fix: pass a free port as "
                    "--main_process_port on every machine, or stop the program that holds it."
                )
            raise RendezvousError(
                f"port {rdzv.port} (--main_process_port) cannot be opened on this machine: {busy.strerror}. "
                "Fix: use a port from 1024 to 65535 that this user may open."
            )
        return warnings
    error = _connect_error(addresses[0], rdzv.port, connect_timeout)
    if error is not None and error.errno in _UNREACHABLE:
        raise RendezvousError(
            f"machine 0 at {where} (--main_process_ip, --main_process_port) is unreachable from this machine: "
            f"{error.strerror}. Fix: pass an address of machine 0 on a network this machine reaches, and check "
            "that no firewall blocks the port."
        )
    return warnings


def check_plan(plan: LaunchPlan) -> list[str]:
    """Check the rendezvous of a launch plan before its processes start.

    Args:
        plan: a :class:`~accelerando.launchers.plan.LaunchPlan`; only ``"elastic"`` plans are checked.

    Returns:
        Warnings for the user.

    Raises:
        RendezvousError: see :func:`check_rendezvous`.
    """
    if plan.mode != "elastic":
        return []
    rdzv = rendezvous_of(plan.agent_args)
    return check_rendezvous(rdzv) if rdzv is not None else []


def socket_interfaces(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` for a launch on several machines, where gloo's own choice cannot work.

    gloo listens on the address the host name resolves to; where that is a loopback address, the
    processes of the other machines never reach it and the job hangs in its first collective. Then
    the interface this machine reaches machine 0 through is named
    (:func:`accelerando.launchers.network.gloo_interface`).

    Args:
        plan: a :class:`~accelerando.launchers.plan.LaunchPlan`.
        environ: the launcher's environment (a ``GLOO_SOCKET_IFNAME`` set there is left alone).

    Returns:
        ``{"GLOO_SOCKET_IFNAME": name}``, or empty (one machine, set by the user, or gloo's choice is fine).
    """
    if plan.mode != "elastic" or plan.num_machines <= 1 or environ.get("GLOO_SOCKET_IFNAME"):
        return {}
    rdzv = rendezvous_of(plan.agent_args)
    name = gloo_interface(rdzv.host, rdzv.port) if rdzv is not None else None
    return {"GLOO_SOCKET_IFNAME": name} if name else {}
