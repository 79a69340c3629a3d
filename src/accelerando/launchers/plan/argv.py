"""The command lines of a launch: the script's own, the elastic agent's, DeepSpeed's runner's, mpirun's."""

from __future__ import annotations

from collections.abc import Callable

from accelerando.backends.strategies import DistributedKind
from accelerando.core.settings.resolve import Settings
from accelerando.launchers.mpirun import MpiRun, mpirun_argv
from accelerando.launchers.plan.checks import RANGE_RDZV_BACKEND, machine_counts, rdzv_conf_keys
from accelerando.launchers.plan.environment import _on_loopback
from accelerando.launchers.plan.spec import Command

__all__ = ["DYNAMIC_BACKENDS", "ELASTIC_MODULE", "rendezvous_backend", "rendezvous_timeouts"]

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


#: The rendezvous backends served by torch's dynamic handler (the ``--rdzv_conf`` keys below are its).
DYNAMIC_BACKENDS = ("c10d", "etcd-v2")
# The two keys of the peer timeout: the user's one of them keeps the launch from adding the other.
_KEEP_ALIVE = frozenset({"keep_alive_interval", "keep_alive_max_attempt"})


def rendezvous_timeouts(settings: Settings) -> dict[str, int]:
    """The dynamic rendezvous' timing keys from the settings ``rdzv_last_call_timeout`` and ``rdzv_peer_timeout``.

    The peer timeout becomes torch's keep-alive interval (at most 5 s, torch's default, at least 1 s;
    a third of the timeout) times the attempts that fill the timeout: 15 s is torch's own 5 s x 3.

    Args:
        settings: the launcher's resolved settings.

    Returns:
        ``{"last_call_timeout": ..., "keep_alive_interval": ..., "keep_alive_max_attempt": ...}`` (seconds, count).
    """
    peer = int(settings.rdzv_peer_timeout)
    interval = min(5, max(1, round(peer / 3)))
    return {
        "last_call_timeout": int(settings.rdzv_last_call_timeout),
        "keep_alive_interval": interval,
        "keep_alive_max_attempt": max(1, -(-peer // interval)),
    }


def _rdzv_conf(settings: Settings, backend: str, ranged: bool) -> str | None:
    """``--rdzv_conf``: the user's keys, then what the launch adds where the user set none.

    A dynamic backend gets the timing keys of :func:`rendezvous_timeouts`. On a machine range, a
    machine other than 0 gets ``is_host=false``: the c10d backend hosts its store on every machine
    whose address matches the endpoint (all of them on one host), and a machine other than 0 that
    hosted it would take the rendezvous down when it leaves.
    """
    conf = settings.rdzv_conf or ""
    keys = rdzv_conf_keys(conf)
    added = []
    if ranged and (settings.machine_rank or 0) > 0 and "is_host" not in keys:
        added.append("is_host=false")
    if backend in DYNAMIC_BACKENDS:
        given = keys | (_KEEP_ALIVE if keys & _KEEP_ALIVE else set())
        added += [
            f"{key}={value}" for key, value in rendezvous_timeouts(settings).items() if key not in given
        ]
    return ",".join(filter(None, (conf, *added))) or None


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
    rdzv_conf = _rdzv_conf(settings, backend, low != machines)
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
