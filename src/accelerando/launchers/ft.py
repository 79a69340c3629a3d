"""Fault-tolerant launches: a torchft lighthouse and one job per replica group, each restarted on failure.

``accelerando launch --fault_tolerance --ft_replica_groups N`` comes here (from
:mod:`accelerando.commands.launch.entry`). :func:`build` is pure: it turns the settings and one launch
plan per group (each with its own rendezvous port) into a :class:`FaultTolerantPlan`. :func:`run` starts
the lighthouse on this machine unless ``--ft_lighthouse`` names one, starts every group, and restarts a
group that fails (up to ``--max_restarts`` times each) while the others keep running: the restarted
group recovers the weights from a live one through torchft, not from a checkpoint.

Exit status: 0 when every group finished with 0; otherwise the status of the first group that failed
for good (out of restarts). torchft (and torch) are imported only to start the lighthouse.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from accelerando.core.listeners import (
    LOOPBACK,
    advertised_host,
    check_torchft_exposure,
    is_loopback,
    is_wildcard,
    listen_address,
)
from accelerando.core.settings.fields import FIELDS_BY_NAME
from accelerando.core.settings.machine import detect_machine
from accelerando.core.settings.resolve import Settings
from accelerando.launchers._child import set_parent_death_signal
from accelerando.launchers.plan import LaunchPlan, loopback_sockets

if TYPE_CHECKING:
    from torchft._torchft import LighthouseServer

__all__ = ["DEFAULT_REPLICA_GROUPS", "FaultTolerantPlan", "ReplicaGroup", "build", "run"]

#: Replica groups started when ``--ft_replica_groups`` is not given.
DEFAULT_REPLICA_GROUPS = 2
#: Seconds without a heartbeat after which the lighthouse drops a group, when not given (torchft's).
DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0
#: torchft's Rust side logs every quorum and commit at INFO (about 20 lines a step); the launch keeps
#: warnings and errors unless RUST_LOG is set.
_TORCHFT_LOG_LEVEL = {"RUST_LOG": "warn"}
_REPLICA_ID_ENV = FIELDS_BY_NAME["ft_replica_id"].our_env
_LIGHTHOUSE_ENV = FIELDS_BY_NAME["ft_lighthouse"].our_env


@dataclass(frozen=True)
class ReplicaGroup:
    """One replica group: its number and its own launch (the environment names the group).

    Attributes:
        replica_id: the group's number, 0-based.
        plan: the group's launch plan (one process: ``simple``; several: ``elastic``).
    """

    replica_id: int
    plan: LaunchPlan


@dataclass(frozen=True)
class FaultTolerantPlan:
    """Everything a fault-tolerant launch starts.

    Attributes:
        groups: the replica groups, in order.
        lighthouse: the address of a running lighthouse, or None to start one here.
        min_replicas: groups that must take part in a step (the lighthouse's ``min_replicas``).
        heartbeat_timeout_s: seconds without a heartbeat after which the lighthouse drops a group.
        max_restarts: restarts allowed to each group before the launch fails.
        monitor_interval_s: seconds between checks of the groups' processes.
        notes: sentences to show the user.
        bind_address: where the lighthouse (and every group's servers) listen: loopback unless
            ``--bind_address`` names another address (which needs ``--ft_insecure``).
    """

    groups: tuple[ReplicaGroup, ...]
    lighthouse: str | None
    min_replicas: int
    heartbeat_timeout_s: float
    max_restarts: int
    monitor_interval_s: float = 0.1
    notes: tuple[str, ...] = field(default_factory=tuple)
    bind_address: str = LOOPBACK

    def describe(self) -> str:
        """A human-readable summary (what ``--dry_run`` adds for a fault-tolerant launch)."""
        where = self.lighthouse or "started on this machine"
        lines = [
            f"Fault tolerance: {len(self.groups)} replica group(s), lighthouse {where}, min_replicas "
            f"{self.min_replicas}, heartbeat timeout {self.heartbeat_timeout_s:g} s, up to {self.max_restarts} "
            "restart(s) per group"
        ]
        lines += [f"Group {g.replica_id}: {g.plan.describe().splitlines()[1]}" for g in self.groups]
        return "\n".join(lines)


def build(
    settings: Settings, first_plan: LaunchPlan, next_plan: Callable[[], LaunchPlan]
) -> FaultTolerantPlan:
    """Plan a fault-tolerant launch (pure: nothing starts).

    Args:
        settings: the launch's resolved settings (``fault_tolerance`` set).
        first_plan: the launch plan already built for these settings (group 0's).
        next_plan: builds another plan for the same settings, with its own rendezvous port (groups 1..N-1).

    Returns:
        The plan: each group's launch with ``ACCELERANDO_FT_REPLICA_ID`` (and the lighthouse address when
        one was given) in its environment.

    Raises:
        ValueError: a launch on several machines (each machine would start its own groups and lighthouse:
            give --ft_lighthouse and launch each machine's groups with --num_machines 1),
            ft_min_replicas larger than the number of groups, torchft's servers asked to listen beyond
            loopback without ``--ft_insecure``, or a lighthouse on another machine while this machine's
            groups listen on loopback (other machines' groups could not reach them).
    """
    count = settings.ft_replica_groups or DEFAULT_REPLICA_GROUPS
    min_replicas = settings.ft_min_replicas or 1
    if first_plan.num_machines != 1:
        raise ValueError(
            f"--fault_tolerance runs each replica group as its own job on this machine, and this launch spans "
            f"{first_plan.num_machines} machines; launch the groups of each machine with --num_machines 1 and a "
            "shared --ft_lighthouse http://host:port"
        )
    if min_replicas > count and settings.ft_lighthouse is None:
        raise ValueError(
            f"ft_min_replicas={min_replicas} (from {settings.source('ft_min_replicas')}) exceeds the "
            f"{count} replica group(s) of this launch, so no step could ever be committed; lower it or raise "
            "--ft_replica_groups"
        )
    bind = listen_address(settings.bind_address, None)
    check_torchft_exposure(bind, bool(settings.ft_insecure))
    _check_lighthouse_reach(settings, bind)
    plans = [first_plan, *(next_plan() for _ in range(count - 1))]
    extra = {_LIGHTHOUSE_ENV: settings.ft_lighthouse} if settings.ft_lighthouse else {}
    groups = tuple(
        ReplicaGroup(i, replace(plan, argv=_bound(plan), env={**plan.env, **extra, _REPLICA_ID_ENV: str(i)}))
        for i, plan in enumerate(plans)
    )
    return FaultTolerantPlan(
        groups=groups,
        lighthouse=settings.ft_lighthouse,
        min_replicas=min_replicas,
        heartbeat_timeout_s=(
            settings.ft_heartbeat_timeout
            if settings.ft_heartbeat_timeout is not None
            else DEFAULT_HEARTBEAT_TIMEOUT_S
        ),
        max_restarts=settings.max_restarts or 0,
        monitor_interval_s=settings.monitor_interval or 0.1,
        bind_address=bind,
    )


def _bound(plan: LaunchPlan) -> tuple[str, ...]:
    """A group's command: an elastic one runs torchrun with its stores bound to the plan's bind address."""
    if plan.mode != "elastic":
        return plan.argv
    return (plan.argv[0], "-m", "accelerando.launchers.bound_rendezvous", plan.bind_address, *plan.agent_args)


def _check_lighthouse_reach(settings: Settings, bind: str) -> None:
    """A lighthouse on another machine means groups on other machines: this machine's must be reachable."""
    if not settings.ft_lighthouse or not is_loopback(bind):
        return
    host = urllib.parse.urlsplit(settings.ft_lighthouse).hostname or ""
    if host and not is_loopback(host):
        raise ValueError(
            f"--ft_lighthouse {settings.ft_lighthouse} (from {settings.source('ft_lighthouse')}) is on another "
            "machine, so other machines' replica groups heal from and all-reduce with this machine's, whose servers "
            "listen on 127.0.0.1 by default. Fix: pass --bind_address <this machine's address> --ft_insecure "
            "(torchft's servers have no authentication: only on a network where every machine is trusted)"
        )


class _Lighthouse:
    """The torchft lighthouse this launch started (None of it when an address was given)."""

    def __init__(self, plan: FaultTolerantPlan) -> None:
        self.server: LighthouseServer | None = None
        self.address = plan.lighthouse
        if self.address is None:
            from torchft._torchft import LighthouseServer

            timeout_ms = max(1, int(plan.heartbeat_timeout_s * 1000))
            bind = plan.bind_address
            host = "[::]" if is_wildcard(bind) else (f"[{bind}]" if ":" in bind else bind)
            self.server = LighthouseServer(
                bind=f"{host}:0",
                min_replicas=plan.min_replicas,
                join_timeout_ms=timeout_ms,
                heartbeat_timeout_ms=timeout_ms,
            )
            # torchft advertises this machine's host name; the groups connect where it listens.
            port = urllib.parse.urlsplit(str(self.server.address())).port
            advertised = advertised_host(bind)
            self.address = f"http://{f'[{advertised}]' if ':' in advertised else advertised}:{port}"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None


def _start(group: ReplicaGroup, extra_env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start one replica group's launch; it dies with this launcher (Linux's parent-death signal)."""
    launcher = os.getpid()

    def _in_child() -> None:
        set_parent_death_signal(launcher)

    env = {**os.environ, **group.plan.env, **extra_env}
    linux = sys.platform.startswith("linux")
    return subprocess.Popen(list(group.plan.argv), env=env, preexec_fn=_in_child if linux else None)


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"accelerando launch: {message}", file=sys.stderr, flush=True)


def _status_text(code: int) -> str:
    if code < 0:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with status {code}"


_FORWARDED = ("SIGTERM", "SIGHUP", "SIGUSR1")


class _Groups:
    """The running replica groups; SIGTERM/SIGHUP/SIGUSR1 to the launcher reach every group and end restarts."""

    def __init__(self, plan: FaultTolerantPlan, extra_env: Mapping[str, str]) -> None:
        self.plan, self.extra_env = plan, extra_env
        self.running = {g.replica_id: _start(g, extra_env) for g in plan.groups}
        self.stopping = False

    def forward(self, signum: int, _frame: object) -> None:
        """Pass the signal on to every running group (a group may checkpoint on it); restart none after."""
        self.stopping = True
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signum)

    def restart(self, replica_id: int) -> None:
        self.running[replica_id] = _start(self.plan.groups[replica_id], self.extra_env)


def _supervise(plan: FaultTolerantPlan, extra_env: Mapping[str, str], quiet: bool) -> int:
    """Run every group to its end, restarting failed ones; the launch's exit status."""
    groups = _Groups(plan, extra_env)
    previous = {
        sig: signal.signal(sig, groups.forward)
        for sig in (getattr(signal, name, None) for name in _FORWARDED)
        if sig is not None
    }
    restarts = dict.fromkeys(groups.running, 0)
    failed: int | None = None
    try:
        while groups.running:
            time.sleep(plan.monitor_interval_s)
            for replica_id, process in list(groups.running.items()):
                code = process.poll()
                if code is None:
                    continue
                del groups.running[replica_id]
                if code == 0:
                    continue
                if restarts[replica_id] < plan.max_restarts and failed is None and not groups.stopping:
                    restarts[replica_id] += 1
                    _say(
                        f"replica group {replica_id} {_status_text(code)}; restarting it ({restarts[replica_id]} "
                        f"of {plan.max_restarts}) while the other groups train on",
                        quiet,
                    )
                    groups.restart(replica_id)
                    continue
                why = (
                    "the launch was asked to stop" if groups.stopping else "no restart left (--max_restarts)"
                )
                _say(f"replica group {replica_id} {_status_text(code)}; {why}", quiet)
                failed = failed if failed is not None else (128 - code if code < 0 else code)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return failed or 0


def run(plan: FaultTolerantPlan, quiet: bool = False) -> int:
    """Start the lighthouse (unless given) and every replica group; restart groups that fail.

    Args:
        plan: from :func:`build`.
        quiet: print nothing of the launcher's own (restarts, the lighthouse address).

    Returns:
        0 when every group finished with 0, else the exit status of the first group out of restarts
        (128 + N for a group killed by signal N); 130 after Ctrl-C.

    Raises:
        ImportError: a lighthouse must be started and torchft is not installed (the message names the extra).
    """
    log_level = {} if "RUST_LOG" in os.environ else _TORCHFT_LOG_LEVEL
    # The groups' gloo sockets (across groups too) listen on this machine only when the servers do.
    sockets = loopback_sockets(detect_machine()) if is_loopback(plan.bind_address) else {}
    os.environ.update(log_level)  # the lighthouse logs from this process
    try:
        lighthouse = _Lighthouse(plan)
    except ImportError as err:
        raise ImportError(
            f"--fault_tolerance starts a torchft lighthouse, and torchft cannot be imported ({err}); install it "
            "with `pip install 'accelerando[torchft]'` or give --ft_lighthouse"
        ) from err
    assert lighthouse.address is not None
    _say(f"fault tolerance: {len(plan.groups)} replica group(s), lighthouse {lighthouse.address}", quiet)
    try:
        return _supervise(plan, {**sockets, **log_level, _LIGHTHOUSE_ENV: lighthouse.address}, quiet)
    except KeyboardInterrupt:
        return 130
    finally:
        lighthouse.close()
