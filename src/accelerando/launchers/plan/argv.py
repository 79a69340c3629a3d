"""The command lines of a launch: the script's own, the elastic agent's, DeepSpeed's runner's, mpirun's."""

from __future__ import annotations

from collections.abc import Callable

from accelerando.backends.strategies import DistributedKind
from accelerando.core.settings.resolve import Settings
from accelerando.launchers.mpirun import MpiRun, mpirun_argv
from accelerando.launchers.plan.checks import RANGE_RDZV_BACKEND, machine_counts
from accelerando.launchers.plan.environment import _on_loopback
from accelerando.launchers.plan.spec import Command

__all__ = ["ELASTIC_MODULE", "rendezvous_backend"]

#: The module the elastic agent runs as (``python -m torch.distributed.run``).
ELASTIC_MODULE = "torch.distributed.run"
_CHILD_MODULE = "accelerando.launchers._child"


def _via_child(command: Command) -> Command:
    """The same target started through :mod:`accelerando.launchers._child` (no run folder, no launcher pid).

    Used where no elastic agent wraps the processes, so that ``--install_as_accelerate`` still runs first.
    """
    kind = "module" if command.module else "script"
    return Command(_CHILD_MODULE, ("-", "0", kind, command.target, *command.args), module=True)


def _target_argv(command: Command, python: str) -> list[str]:
    if command.no_python:
        return [command.target, *command.args]
    if command.module:
        return [python, "-m", command.target, *command.args]
    return [python, command.target, *command.args]


def rendezvous_backend(settings: Settings) -> str:
    """The rendezvous backend of a launch: the one given, or ``c10d`` for a machine range left on the default.

    A static rendezvous needs a fixed machine count, so ``--num_machines MIN:MAX`` without
    ``--rdzv_backend`` uses PyTorch's ``c10d`` backend, hosted by machine 0's agent.
    """
    low, high = machine_counts(settings)
    if low != high and settings.source("rdzv_backend") == "default":
        return RANGE_RDZV_BACKEND
    return str(settings.rdzv_backend)


def _range_rdzv_conf(settings: Settings) -> str | None:
    """``--rdzv_conf`` of a machine range: the user's, plus ``is_host=false`` on a machine other than 0.

    The c10d backend hosts its store on every machine whose address matches the endpoint (all of them
    on one host); a machine other than 0 that hosted it would take the rendezvous down when it leaves.
    """
    conf = settings.rdzv_conf or ""
    keys = {item.split("=", 1)[0].strip() for item in conf.split(",") if item.strip()}
    if (settings.machine_rank or 0) > 0 and "is_host" not in keys:
        conf = ",".join(filter(None, (conf, "is_host=false")))
    return conf or None


def _agent_argv(settings: Settings, command: Command, per_node: int, port: Callable[[], int]) -> list[str]:
    low, machines = machine_counts(settings)
    address = settings.main_process_ip or "127.0.0.1"
    main_port = settings.main_process_port or (port() if machines == 1 else 29500)
    backend = rendezvous_backend(settings)
    argv = [
        "--nnodes",
        f"{low}:{machines}" if low != machines else str(machines),
        "--nproc_per_node",
        str(per_node),
    ]
    if low == machines or backend == "static":  # a dynamic rendezvous of a range ranks the machines itself
        argv += ["--node_rank", str(settings.machine_rank or 0)]
    rdzv_conf = _range_rdzv_conf(settings) if low != machines else settings.rdzv_conf
    if backend == "static":
        argv += ["--master_addr", address, "--master_port", str(main_port)]
    else:
        argv += ["--rdzv_backend", backend, "--rdzv_endpoint", f"{address}:{main_port}"]
        if low != machines:  # every machine derives the same id without talking to the others
            argv += ["--rdzv_id", f"accelerando-{main_port}"]
        if _on_loopback(address, machines):
            # The agent hosts the workers' store at this address (its host name otherwise): loopback.
            argv += ["--local_addr", address]
    if rdzv_conf:
        argv += ["--rdzv_conf", rdzv_conf]
    argv += [
        "--max_restarts",
        str(settings.max_restarts),
        "--monitor_interval",
        f"{settings.monitor_interval:g}",
    ]
    return [*argv, *_launcher_target(command)]


def _launcher_target(command: Command) -> list[str]:
    """The script (or module / program) part of a torchrun-style or DeepSpeed-runner command line."""
    mode = ["--module"] if command.module else ["--no_python"] if command.no_python else []
    return [*mode, command.target, *command.args]


def _runner_argv(
    settings: Settings, command: Command, runner: DistributedKind, machines: int, per_node: int, python: str
) -> list[str]:
    """``python -m <runner> ...`` (DeepSpeed's runner and its options): the main machine starts every host."""
    argv = [
        python,
        "-m",
        str(runner.multinode_runner),
        "--no_local_rank",
        "--num_nodes",
        str(machines),
        "--num_gpus",
        str(per_node),
        "--master_addr",
        settings.main_process_ip or "127.0.0.1",
        "--master_port",
        str(settings.main_process_port or 29500),
        "--launcher",
        settings.deepspeed_multinode_launcher or "pdsh",
    ]
    if settings.deepspeed_hostfile:
        argv += ["--hostfile", settings.deepspeed_hostfile]
    if settings.deepspeed_inclusion_filter:
        argv += ["--include", settings.deepspeed_inclusion_filter]
    if settings.deepspeed_exclusion_filter:
        argv += ["--exclude", settings.deepspeed_exclusion_filter]
    return [*argv, *_launcher_target(command)]


def _mpirun_launch(
    settings: Settings,
    env: dict[str, str],
    notes: list[str],
    mpirun: Callable[[], MpiRun],
    port: Callable[[], int],
    shape: tuple[int, int, int],
) -> list[str]:
    """The ``mpirun`` part of an ``mpirun_hostfile`` launch's command line.

    Sets the rendezvous (and oneCCL worker count) in ``env``, which mpirun forwards to every process,
    and adds a note naming the mpirun found. ``shape`` is (processes, processes per machine, machines).

    Raises:
        ValueError: ``mpirun`` is missing or unknown.
    """
    total, per_node, machines = shape
    assert settings.mpirun_hostfile is not None  # build.py takes this path only when it is set
    found = mpirun()
    main_port = settings.main_process_port or (port() if machines == 1 else 29500)
    env["MASTER_ADDR"] = settings.main_process_ip or "127.0.0.1"
    env["MASTER_PORT"] = str(main_port)
    if settings.mpirun_ccl is not None:
        env["CCL_WORKER_COUNT"] = str(settings.mpirun_ccl)
    notes.append(
        f"multi-CPU job started by {found.flavour} mpirun on the hosts of {settings.mpirun_hostfile}"
    )
    return mpirun_argv(found, settings.mpirun_hostfile, total, per_node, forward=env)
