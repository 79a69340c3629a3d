"""The driver of ``accelerando launch --ray``: N Ray actors, each running one process of the script.

Who calls what, in order (:func:`run_on_ray`):

1. connect to the cluster (``ray.init`` with the ``--ray`` address; ``default``: Ray's own choice);
2. make ``num_processes`` :class:`~accelerando.launchers.ray.worker.RankProcess` actors, each asking for
   ``num_cpu_threads_per_process`` CPUs (1 when unset) and, unless ``--cpu``, one GPU when the cluster
   has GPUs;
3. rank them by machine (the processes of one machine get consecutive ranks, as torchrun's do), pick
   the rendezvous on rank 0's machine, and start every process with a torchrun process's variables
   plus the settings the launch carries (the same ``ACCELERANDO_*`` a local launch exports);
4. stream every line the processes write to this terminal (stdout to stdout, stderr to stderr) until
   they end. When one fails, the others are stopped (SIGTERM, then SIGKILL) and, while
   ``--max_restarts`` allows, all start again with ``TORCHELASTIC_RESTART_COUNT`` one higher (a script
   with ``auto_resume`` resumes from its last checkpoint); an actor whose Ray worker died is replaced.

The exit status is a local launch's: 0 when every process succeeded, else the first failure's exit
code (128 + N for a process killed by signal N), with one line naming the process that failed first.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accelerando.core.listeners import LOOPBACK
from accelerando.core.settings.machine import SOCKET_IFNAME_ENV
from accelerando.core.settings.resolve import Settings
from accelerando.launchers.plan import Command, LaunchPlan
from accelerando.launchers.ray.worker import RankProcess

if TYPE_CHECKING:
    from types import ModuleType

    from ray.actor import ActorHandle

__all__ = ["Failure", "check_ray_settings", "failure_summary", "process_env", "rank_by_machine", "run_on_ray"]

# Seconds between two reads of the processes' output and state.
_POLL_S = 0.05


@dataclass(frozen=True)
class Failure:
    """How one process ended badly: its rank, the machine, the status, and the poll round it was seen in."""

    rank: int
    node_ip: str
    pid: int | None
    code: int
    seen: int
    lost: bool = False  # its Ray worker (the actor) died, not only the script

    def describe(self) -> str:
        """``was killed by signal 9 (SIGKILL)`` / ``failed with exit code 3`` / ``lost its Ray worker``."""
        if self.lost:
            return "lost its Ray worker (the actor or its machine died)"
        if self.code < 0:
            number = -self.code
            name = signal.Signals(number).name if number in signal.valid_signals() else "?"
            return f"was killed by signal {number} ({name})"
        return f"failed with exit code {self.code}"

    @property
    def exit_status(self) -> int:
        """The launch's exit status for this failure (128 + N for signal N, as a shell reports it)."""
        return 128 - self.code if self.code < 0 else (self.code or 1)

    def blame_order(self) -> tuple[int, int, int]:
        """Earliest first; among those seen together, a kill, then an error, then SIGTERM (a victim)."""
        if self.lost or (self.code < 0 and -self.code != signal.SIGTERM):
            kind = 0
        else:
            kind = 2 if self.code in (-signal.SIGTERM, 143) else 1
        return (self.seen, kind, self.rank)


@dataclass
class _Worker:
    actor: ActorHandle
    node_ip: str = ""
    node_id: str = ""
    pid: int | None = None
    code: int | None = None
    lost: bool = False
    tail: list[str] = field(default_factory=list)


def rank_by_machine(places: Sequence[tuple[str, str]]) -> list[tuple[int, int, int, int]]:
    """Give the processes of one machine consecutive ranks, machines in first-seen order (as torchrun does).

    Args:
        places: ``(node_ip, node_id)`` of each actor, in the order the actors were made.

    Returns:
        For each actor (same order): ``(rank, local_rank, node_rank, local_world_size)``.
    """
    nodes = list(dict.fromkeys(node for _ip, node in places))
    order = sorted(range(len(places)), key=lambda i: (nodes.index(places[i][1]), i))
    counts = {node: sum(1 for _ip, n in places if n == node) for node in nodes}
    result: dict[int, tuple[int, int, int, int]] = {}
    next_local: dict[str, int] = {}
    for rank, i in enumerate(order):
        node = places[i][1]
        local = next_local.get(node, 0)
        next_local[node] = local + 1
        result[i] = (rank, local, nodes.index(node), counts[node])
    return [result[i] for i in range(len(places))]


def process_env(
    base: dict[str, str],
    *,
    rank: int,
    local_rank: int,
    node_rank: int,
    local_world_size: int,
    world_size: int,
    num_machines: int,
    address: str,
    port: int,
    attempt: int,
    max_restarts: int,
) -> dict[str, str]:
    """The variables of one process: the launch's settings plus a torchrun process's rank variables.

    Args:
        base: the settings the launch carries (``ACCELERANDO_*`` and the reference's variables).
        rank: global rank; local_rank: index on its machine; node_rank: index of its machine.
        local_world_size: processes on its machine; world_size: processes in all.
        num_machines: machines the job's processes landed on.
        address: rank 0's machine; port: the rendezvous port there.
        attempt: how many times the job restarted (0 on the first try).
        max_restarts: restarts allowed.

    Returns:
        The variables to add to the actor's environment for this process.
    """
    return {
        **base,
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "ACCELERANDO_MACHINE_RANK": str(node_rank),
        "ACCELERANDO_NUM_MACHINES": str(num_machines),
        "ACCELERANDO_NUM_PROCESSES": str(world_size),
    }


def _connect(address: str) -> ModuleType:
    import ray

    if not ray.is_initialized():
        ray.init(
            address=None if address == "default" else address,
            log_to_driver=False,  # the driver relays the processes' own output, nothing else
            logging_level=logging.WARNING,
            include_dashboard=False,
        )
    return ray


def _resources(ray: ModuleType, settings: Settings) -> dict[str, float]:
    cpus = float(settings.num_cpu_threads_per_process or 1)
    gpus = 0.0 if settings.cpu else (1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0)
    return {"num_cpus": cpus, "num_gpus": gpus}


def _kind(command: Command) -> str:
    return "module" if command.module else "program" if command.no_python else "script"


def _target(command: Command) -> str:
    if command.module or command.no_python:
        return command.target
    return os.path.abspath(command.target)


class _Job:
    """The actors of one ``--ray`` launch, their tries and their output."""

    def __init__(self, ray: ModuleType, settings: Settings, plan: LaunchPlan, command: Command) -> None:

        self.ray = ray
        self.settings = settings
        self.plan = plan
        self.command = command
        self.resources = _resources(ray, settings)
        self.actor_class = ray.remote(**self.resources)(RankProcess)
        self.workers = [_Worker(self.actor_class.remote()) for _ in range(plan.num_processes)]
        self.base_env = self._base_env()

    def _base_env(self) -> dict[str, str]:
        env = dict(self.plan.env)
        if self.settings.num_cpu_threads_per_process is None:
            env["OMP_NUM_THREADS"] = str(int(self.resources["num_cpus"]))
        if self.resources["num_gpus"]:
            env["ACCELERATE_TORCH_DEVICE"] = "cuda:0"  # Ray shows each actor its one GPU as device 0
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray sets each actor's
        return env

    def start(self, attempt: int) -> None:
        """Replace dead actors, rank the actors by machine and start every process."""
        for worker in self.workers:
            if worker.lost:
                worker.actor, worker.lost = self.actor_class.remote(), False
            worker.code, worker.pid = None, None
        places = self.ray.get([w.actor.where.remote() for w in self.workers])
        for worker, (ip, node, _pid) in zip(self.workers, places, strict=True):
            worker.node_ip, worker.node_id = ip, node
        ranks = rank_by_machine([(w.node_ip, w.node_id) for w in self.workers])
        self.workers = [w for _, w in sorted(zip(ranks, self.workers, strict=True), key=lambda x: x[0][0])]
        ranks.sort()
        main = self.workers[0]
        port = self.ray.get(main.actor.free_port.remote())
        machines = len({w.node_id for w in self.workers})
        # On one machine the store and gloo/NCCL sockets are this machine's only (loopback).
        address = LOOPBACK if machines == 1 else main.node_ip
        base = dict(self.base_env)
        if machines > 1:  # the plan pinned gloo/NCCL to loopback (one machine); the actors landed on several
            for name in SOCKET_IFNAME_ENV:
                base.pop(name, None)
        starts = []
        for worker, (rank, local, node_rank, local_size) in zip(self.workers, ranks, strict=True):
            env = process_env(
                base, rank=rank, local_rank=local, node_rank=node_rank, local_world_size=local_size,
                world_size=len(self.workers), num_machines=machines, address=address, port=port,
                attempt=attempt, max_restarts=int(self.settings.max_restarts or 0),
            )  # fmt: skip
            starts.append(
                worker.actor.start.remote(
                    _kind(self.command), _target(self.command), list(self.command.args), env, os.getcwd()
                )
            )
        for worker, pid in zip(self.workers, self.ray.get(starts), strict=True):
            worker.pid = pid

    def wait(self) -> list[Failure]:
        """Relay output until every process ended or one failed; stop the rest then. Return the failures."""
        rounds = 0
        failures: list[Failure] = []
        while any(w.code is None and not w.lost for w in self.workers):
            rounds += 1
            self._poll_once(rounds, failures)
            if failures:
                self._stop_all(rounds, failures)
                break
            time.sleep(_POLL_S)
        return sorted(failures, key=Failure.blame_order)

    def _poll_once(self, rounds: int, failures: list[Failure]) -> None:
        from ray.exceptions import RayActorError

        running = [w for w in self.workers if w.code is None and not w.lost]
        refs = [w.actor.poll.remote() for w in running]
        for rank_worker, ref in zip(running, refs, strict=True):
            rank = self.workers.index(rank_worker)
            try:
                lines, code = self.ray.get(ref)
            except RayActorError:
                rank_worker.lost = True
                failures.append(
                    Failure(rank, rank_worker.node_ip, rank_worker.pid, -signal.SIGKILL, rounds, True)
                )
                continue
            for stream, text in lines:
                (sys.stdout if stream == "stdout" else sys.stderr).write(text)
            if code is not None:
                rank_worker.code = code
                if code != 0:
                    failures.append(Failure(rank, rank_worker.node_ip, rank_worker.pid, code, rounds))
        sys.stdout.flush()
        sys.stderr.flush()

    def _stop_all(self, rounds: int, failures: list[Failure]) -> None:
        from ray.exceptions import RayActorError

        alive = [w for w in self.workers if w.code is None and not w.lost]
        codes = [w.actor.stop.remote() for w in alive]
        self._poll_once(rounds + 1, failures)  # the lines they wrote until stopped
        for worker, ref in zip(alive, codes, strict=True):
            try:
                code = self.ray.get(ref)
            except RayActorError:
                worker.lost = True
                continue
            if worker.code is None and code is not None:
                worker.code = code
                if code != 0:
                    failures.append(
                        Failure(self.workers.index(worker), worker.node_ip, worker.pid, code, rounds + 1)
                    )

    def shutdown(self) -> None:
        """Stop every process and release the actors."""
        for worker in self.workers:
            if not worker.lost:
                try:
                    self.ray.get(worker.actor.stop.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - an actor already gone has nothing left to stop
                    pass
                self.ray.kill(worker.actor)


def failure_summary(failures: Sequence[Failure]) -> str:
    """One line naming the process that failed first (the likely cause) and the others."""
    first, others = failures[0], failures[1:]
    also = "; ".join(f"process {f.rank} {f.describe()}" for f in others)
    also_text = f" Also: {also}." if others else ""
    return (
        f"accelerando launch: process {first.rank} (on {first.node_ip}, pid {first.pid}) {first.describe()}; "
        f"its output is above.{also_text} {len(failures)} process(es) failed in all."
    )


def check_ray_settings(settings: Settings) -> None:
    """Refuse settings that start or place the processes some other way than ``--ray`` does.

    Raises:
        ValueError: ``fault_tolerance`` (replica groups under a torchft lighthouse) or ``mpirun_hostfile``
            (mpirun starts the processes) set together with ``ray``; the message names both sources.
    """
    for name, what in (("fault_tolerance", "replica groups under a torchft lighthouse"),
                       ("mpirun_hostfile", "mpirun starts the processes on its hosts")):  # fmt: skip
        if settings.values.get(name):
            raise ValueError(
                f"--ray ({settings.source('ray')}) and {name} ({settings.source(name)}: {what}) both decide where "
                f"the processes run. Fix: choose one (unset {name} to run on Ray)."
            )


def run_on_ray(settings: Settings, plan: LaunchPlan, command: Command, *, quiet: bool = False) -> int:
    """Run ``command`` as ``plan.num_processes`` processes on the Ray cluster ``settings.ray`` names.

    Args:
        settings: the launch's resolved settings (``ray`` set; ``max_restarts``, ``cpu``,
            ``num_cpu_threads_per_process`` read).
        plan: the local launch plan of the same settings: its ``env`` (the settings carried to every
            process) and ``num_processes`` are used; its command line is not.
        command: the script, module or program each process runs.
        quiet: print only the processes' own output.

    Returns:
        The exit status (see the module docstring).

    Raises:
        ConnectionError: from Ray, when the cluster cannot be reached (the caller prints it).
        ValueError: settings that place processes some other way (``--fault_tolerance``,
            ``--mpirun_hostfile``), named with their source and the fix.
    """
    check_ray_settings(settings)
    ray = _connect(str(settings.ray))
    job = _Job(ray, settings, plan, command)
    restarts = int(settings.max_restarts or 0)
    try:
        for attempt in range(restarts + 1):
            job.start(attempt)
            failures = job.wait()
            if not failures:
                return 0
            print(failure_summary(failures), file=sys.stderr)
            if attempt < restarts and not quiet:
                print(
                    f"accelerando launch: restarting every process ({attempt + 1} of {restarts} restarts, "
                    "--max_restarts)",
                    file=sys.stderr,
                )
        return failures[0].exit_status
    finally:
        job.shutdown()
