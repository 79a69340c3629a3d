"""The one entry point of a launch plan: :func:`build` puts the checks, environment, command line and notes together."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from accelerando.backends.strategies import distributed_kind
from accelerando.core.settings.fields import FIELDS_BY_NAME
from accelerando.core.settings.machine import MachineInfo, detect_machine, free_port
from accelerando.core.settings.resolve import Settings
from accelerando.launchers.limits import check_process_count
from accelerando.launchers.mpirun import MpiRun, detect_mpirun
from accelerando.launchers.plan.argv import (
    ELASTIC_MODULE,
    _agent_argv,
    _mpirun_launch,
    _runner_argv,
    _target_argv,
    _via_child,
)
from accelerando.launchers.plan.checks import _multinode_runner, _where, check_settings, machine_counts
from accelerando.launchers.plan.environment import INSTALL_ENV, _on_loopback, _process_env, loopback_sockets
from accelerando.launchers.plan.notes import (
    _auto_layout,
    _auto_setting_notes,
    _inert_notes,
    _range_note,
    oversubscription_warning,
)
from accelerando.launchers.plan.spec import Command, LaunchPlan

__all__ = ["build"]


def _topology(settings: Settings, machine: MachineInfo) -> tuple[int, int, list[str]]:
    """Total processes and machines, with notes for choices made on the user's behalf."""
    notes: list[str] = []
    machines = machine_counts(settings)[1]
    total = settings.num_processes
    if total is None:
        ids = settings.gpu_ids
        gpus = 0 if settings.cpu else (len(ids.split(",")) if ids and ids != "all" else machine.gpu_count)
        if _is_one_process_kind(settings) or gpus <= 1:
            total = machines
        else:
            # As the reference does: with several GPUs and no process count, use every GPU.
            total = gpus * machines
            notes.append(
                f"num_processes not given: using {total} (one per visible GPU). Pass --num_processes to change."
            )
    return total, machines, notes


def _is_one_process_kind(settings: Settings) -> bool:
    """Whether the settings ask for a one-process kind (``distributed_type: NO``)."""
    kind = distributed_kind(settings.distributed_type)
    return kind is not None and kind.one_process


def build(
    settings: Settings,
    command: Command,
    machine: MachineInfo | None = None,
    *,
    agent_options: Sequence[str] = (),
    port: Callable[[], int] = free_port,
    mpirun: Callable[[], MpiRun] = detect_mpirun,
) -> LaunchPlan:
    """Plan a launch without starting anything.

    Args:
        settings: the launcher's resolved settings (see :func:`accelerando.core.settings.resolve`).
        command: what each process runs.
        machine: the machine the launch runs on; ``None`` detects this one
            (:func:`accelerando.core.settings.machine.detect_machine`).
        agent_options: extra ``torch.distributed.run`` options (``--role``, ``--tee``, ``--log_dir``).
        port: returns a free port for a single-machine job that did not choose one.
        mpirun: finds ``mpirun`` for an ``mpirun_hostfile`` launch (see
            :func:`accelerando.launchers.mpirun.detect_mpirun`).

    Returns:
        The :class:`LaunchPlan`: ``mpirun`` when a hostfile for it is given; one process run directly;
        or an elastic-agent launch when more than one process, more than one machine or restarts are
        asked for. With ``install_as_accelerate`` every process starts through
        :mod:`accelerando.launchers._child`, which installs accelerando as ``accelerate`` first.

    Raises:
        ValueError: for an impossible combination of settings (see :func:`check_settings`), or an
            ``mpirun`` that is missing or unknown.
    """
    if machine is None:
        machine = detect_machine()
    check_settings(settings, machine)
    total, machines, notes = _topology(settings, machine)
    low = machine_counts(settings)[0]
    per_node = total // machines
    check_process_count(per_node, f"{_where(settings, 'num_processes')}={total}")
    if low != machines:
        notes.append(_range_note(settings, low, machines))
    env = _process_env(settings, machine, total, per_node)
    if _is_one_process_kind(settings) and total > 1:
        # A config written for one process must not pin several processes to "not distributed".
        env.pop(FIELDS_BY_NAME["distributed_type"].our_env, None)
        notes.append(
            f"distributed_type 'NO' ({settings.source('distributed_type')}) ignored: {total} processes."
        )
    notes += _auto_setting_notes(settings) + _inert_notes(settings)
    if settings.parallelism == "auto":
        notes += _auto_layout(settings, machine, total, machines, env)
    elastic = total > 1 or machines > 1 or settings.max_restarts > 0 or low != machines
    mode = "elastic" if elastic else "simple"
    runner = _multinode_runner(settings, machines)
    # The elastic agent's processes start through the shim anyway (see runner.py); the others only for this.
    target = _via_child(command) if settings.install_as_accelerate else command
    if settings.mpirun_hostfile:
        if runner is not None:
            raise ValueError(
                f"{_where(settings, 'mpirun_hostfile')} and DeepSpeed's multi-machine runner "
                f"({_where(settings, 'deepspeed_multinode_launcher')}) both start the hosts. Fix: choose one."
            )
        mode = "mpirun"
        argv = _mpirun_launch(settings, env, notes, mpirun, port, (total, per_node, machines))
        argv += _target_argv(target, machine.python)
    elif runner is not None:
        mode = runner.strategy  # the runner's plan is named after its backend ("deepspeed")
        argv = _runner_argv(settings, target, runner, machines, per_node, machine.python)
        notes.append(
            f"multi-machine DeepSpeed job: started from this machine by DeepSpeed's "
            f"{settings.deepspeed_multinode_launcher or 'pdsh'} launcher on every host of the hostfile"
        )
    elif elastic:
        agent = _agent_argv(settings, command, per_node, port)
        argv = [machine.python, "-m", ELASTIC_MODULE, *agent_options, *agent]
    else:
        argv = _target_argv(target, machine.python)
    # What accelerando.core.listeners.listen_address says (not imported here: the one-process launch's start-up).
    bind = (settings.bind_address or settings.main_process_ip or "127.0.0.1").strip()
    if mode == "elastic":  # the processes start on this machine (mpirun and DeepSpeed's runner: on the hosts)
        notes += oversubscription_warning(settings, machine, per_node, machines)
        if _on_loopback(bind, machines):
            env.update(loopback_sockets(machine))
    if settings.install_as_accelerate:
        env[INSTALL_ENV] = "true"
    return LaunchPlan(
        mode=mode,
        argv=tuple(argv),
        env=env,
        num_processes=total,
        nproc_per_node=per_node,
        num_machines=machines,
        machine_rank=settings.machine_rank or 0,
        notes=tuple(notes),
        hang_timeout_s=float(settings.hang_timeout or 0),
        min_machines=low if low != machines else None,
        bind_address=bind,
    )
