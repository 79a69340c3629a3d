"""What a launch runs and the plan that starts it: :class:`Command` and :class:`LaunchPlan`."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from accelerando.launchers.limits import clip

__all__ = ["Command", "LaunchPlan"]


@dataclass(frozen=True, slots=True)
class Command:
    """What to run in each process.

    Attributes:
        target: a script path, a module name (``module=True``) or an executable (``no_python=True``).
        args: arguments passed to it untouched.
        module: run ``target`` as ``python -m target``.
        no_python: run ``target`` directly, without the Python interpreter.
    """

    target: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False

    def __post_init__(self) -> None:
        if self.module and self.no_python:
            raise ValueError("--module and --no_python cannot be combined. Fix: pass only one of them.")


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything needed to start the processes of one launch.

    Attributes:
        mode: ``"simple"`` (one process, run directly), ``"elastic"`` (torch.distributed.run),
            ``"deepspeed"`` (DeepSpeed's multi-node runner, which starts the other hosts itself) or
            ``"mpirun"`` (``mpirun`` starts every process of a multi-CPU job).
        argv: the equivalent command line; for ``"elastic"`` it starts with
            ``python -m torch.distributed.run`` and :func:`run` passes the rest to the agent in-process.
        env: variables to add to the processes' environment.
        num_processes: processes on all machines together.
        nproc_per_node: processes started on this machine.
        num_machines: machines in the job.
        machine_rank: rank of this machine.
        notes: sentences to show the user (choices the plan made for them).
        hang_timeout_s: seconds without progress before the launcher stops a multi-process job
            (0: never); see :mod:`accelerando.launchers.watchdog`.
        min_machines: the fewest machines an elastic job (``--num_machines MIN:MAX``) runs with;
            ``None`` for a fixed machine count. ``num_machines`` and ``num_processes`` are then the
            largest job (MAX machines); the agent tells each process the current ``WORLD_SIZE``.
        bind_address: the address the launch's listeners bind (the rendezvous store): ``--bind_address``,
            else ``--main_process_ip``, else loopback (see :func:`accelerando.core.listeners.listen_address`).
    """

    mode: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    num_processes: int
    nproc_per_node: int
    num_machines: int
    machine_rank: int
    notes: tuple[str, ...] = ()
    hang_timeout_s: float = 0.0
    min_machines: int | None = None
    bind_address: str = "127.0.0.1"

    @property
    def elastic_range(self) -> bool:
        """Whether the machine count may change while the job runs (``--num_machines MIN:MAX``)."""
        return self.min_machines is not None and self.min_machines != self.num_machines

    @property
    def uses_backend_runner(self) -> bool:
        """Whether the plan runs a backend's own multi-machine runner (``mode`` is then the backend's name)."""
        return self.mode not in ("simple", "elastic", "mpirun")

    @property
    def agent_args(self) -> list[str]:
        """Arguments for ``torch.distributed.run`` (the argv after ``python -m torch.distributed.run``)."""
        if self.mode != "elastic":
            raise ValueError("agent_args exists only for an elastic plan.")
        return list(self.argv[3:])

    def describe(self) -> str:
        """Return a human-readable summary (what ``--dry-run`` prints)."""
        if self.elastic_range:
            low = self.min_machines or 1
            topology = (
                f"Topology: {low * self.nproc_per_node} to {self.num_processes} process(es) on {low} to "
                f"{self.num_machines} machine(s) (elastic range {low}:{self.num_machines}: starts once {low} "
                f"machine(s) joined, re-forms when machines join or leave)"
            )
        else:
            topology = f"Topology: {self.num_processes} process(es) on {self.num_machines} machine(s)"
        lines = [
            f"{topology}; this machine (rank {self.machine_rank}) starts {self.nproc_per_node} ({self.mode} launch)",
            "Command: " + shlex.join(clip(arg) for arg in self.argv),  # each value bounded (limits.clip)
            "Environment:",
            *(f"  {key}={clip(value)}" for key, value in sorted(self.env.items())),
        ]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)
