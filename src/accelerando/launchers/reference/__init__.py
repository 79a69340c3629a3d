"""The reference's launch helpers (``accelerate.utils.launch``) over accelerando's launch planning.

Each ``prepare_*`` function takes the ``argparse.Namespace`` of a launch command (the reference's
attribute names: ``training_script``, ``num_processes``, ``mixed_precision``, ``use_fsdp``, ...) and
returns the command and/or the environment for the processes, without starting anything. The settings
are resolved and checked by :mod:`accelerando.core.settings` and the command comes from
:func:`accelerando.launchers.plan.build`, so these helpers and ``accelerando launch`` agree. The
environment carries every given setting twice: under accelerando's ``ACCELERANDO_*`` names and under
the reference's names (``ACCELERATE_MIXED_PRECISION``, ``FSDP_SHARDING_STRATEGY``, ...), which code
written for the reference (transformers among it) reads.

The helpers are split by launcher kind and step; this module keeps the ones built on the launch
plan (and the look-ups of the machine, so they can be replaced in one place) and re-exports the rest:

- ``namespace``: a launch namespace -> resolved settings;
- ``env``: :func:`env_var_path_add`, :func:`prepare_tpu`, :func:`setup_fp8_env`,
  :func:`prepare_extend_env_parallelism_config`;
- ``agent``: the ``torch.distributed.run`` options a plan gives, stored on ``args``;
- ``sagemaker``: :func:`prepare_sagemager_args_inputs`;
- ``fork``: :class:`PrepareForLaunch`.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import types
from shutil import which
from typing import TYPE_CHECKING

from accelerando.common.constants import DEEPSPEED_MULTINODE_LAUNCHERS
from accelerando.common.environment import check_cuda_p2p_ib_support, get_current_device_type
from accelerando.core.settings.fields import FIELDS_BY_NAME, machine_range
from accelerando.core.settings.machine import MachineInfo, detect_machine, free_port
from accelerando.launchers.mpirun import MpiRun
from accelerando.launchers.plan import Command, build
from accelerando.launchers.reference.agent import set_agent_args as _set_agent_args
from accelerando.launchers.reference.agent import with_restarts as _with_restarts
from accelerando.launchers.reference.env import (
    env_var_path_add,
    prepare_extend_env_parallelism_config,
    prepare_tpu,
    setup_fp8_env,
)
from accelerando.launchers.reference.env import setting_text as _text
from accelerando.launchers.reference.fork import PrepareForLaunch
from accelerando.launchers.reference.namespace import settings_from_args as _settings_from_args
from accelerando.launchers.reference.sagemaker import convert_nargs_to_dict as _convert_nargs_to_dict  # noqa: F401 (the reference's private name)
from accelerando.launchers.reference.sagemaker import prepare_sagemager_args_inputs

if TYPE_CHECKING:
    from accelerando.core.settings.resolve import Settings
    from accelerando.launchers.plan import LaunchPlan

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "PrepareForLaunch",
    "PatchThroughModule",
    "env_var_path_add",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "setup_fp8_env",
]

#: The machine look-ups of this module that the reference's tests patch at its utils path
#: (``mock.patch("accelerate.utils.launch.which")``, ``...launch.subprocess.check_output``).
_PATCHABLE = frozenset({"which", "subprocess"})


class PatchThroughModule(types.ModuleType):
    """The class of ``accelerando.utils.launch``: ``which`` and ``subprocess`` there are this module's.

    Reading, setting or deleting them on the address-book module reads, sets or deletes them here,
    where :func:`_mpirun` looks them up, so ``mock.patch("accelerando.utils.launch.which")`` has the
    same effect as patching through the stand-in path (``accelerate.utils.launch``), which is this
    module itself.
    """

    def __getattr__(self, name: str) -> object:
        if name in _PATCHABLE:
            return getattr(sys.modules[__name__], name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        if name in _PATCHABLE:
            setattr(sys.modules[__name__], name, value)
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in _PATCHABLE:
            delattr(sys.modules[__name__], name)
        else:
            super().__delattr__(name)


# The reference logs this code under its utils path; scripts and tests listen there.
logger = logging.getLogger("accelerando.utils.launch")


_DEFAULT_MAIN_PORT = 29500


# --- namespace -> settings and plan ---------------------------------------------------------------


def _command(args: argparse.Namespace, required: bool = True) -> Command:

    script = getattr(args, "training_script", None)
    if not script and required:
        raise ValueError("The launch namespace has no training_script. Fix: set args.training_script.")
    return Command(
        str(script or "script.py"),  # only the agent's options are wanted when there is no script
        tuple(str(a) for a in getattr(args, "training_script_args", None) or ()),
        bool(getattr(args, "module", False)),
        bool(getattr(args, "no_python", False)),
    )


def _mpirun() -> MpiRun:
    """The ``mpirun`` on ``PATH`` and its kind, found through this module's ``which`` and ``subprocess``.

    As the reference: ``mpirun`` is run by name, Open MPI is recognised from ``mpirun --version`` and
    anything else is taken for MPICH / Intel MPI (Hydra options).

    Raises:
        OSError: there is no ``mpirun`` on ``PATH``.
    """
    if not which("mpirun"):
        raise OSError(
            "mpirun or mpiexec were not found. Ensure that Intel MPI, Open MPI, or MVAPICH are installed. "
            "Fix: install one (e.g. `apt-get install openmpi-bin`), or drop mpirun_hostfile."
        )
    version = subprocess.check_output(["mpirun", "--version"])
    text = version.decode(errors="replace") if isinstance(version, bytes) else str(version)
    return MpiRun("mpirun", "openmpi" if "open mpi" in text.lower() else "mpich")


def _plan(
    args: argparse.Namespace, settings: Settings, machine: MachineInfo | None = None, required: bool = True
) -> LaunchPlan:

    port = getattr(args, "main_process_port", None)
    # Port 0 asks for a free port (the reference's automatic choice); no port at all is 29500.
    chosen = (
        (lambda: int(port)) if port else (free_port if port is not None else (lambda: _DEFAULT_MAIN_PORT))
    )
    return build(settings, _command(args, required), machine or detect_machine(), port=chosen, mpirun=_mpirun)


def _reference_env(settings: Settings) -> dict[str, str]:
    """The reference's variable names for every setting some layer gave."""
    env: dict[str, str] = {}
    for name, value in settings.explicitly_set().items():
        field = FIELDS_BY_NAME[name]
        if value is None or not field.env:
            continue
        env[field.env[0]] = _text(value)
    env["ACCELERATE_MIXED_PRECISION"] = _text(settings["mixed_precision"])
    if settings["debug"]:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if settings["enable_cpu_affinity"]:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    gpu_ids = settings["gpu_ids"]
    if gpu_ids and gpu_ids != "all" and not settings["cpu"]:
        env[get_current_device_type()[1]] = gpu_ids
    return env


def _process_env(args: argparse.Namespace, settings: Settings, plan: LaunchPlan) -> dict[str, str]:
    """``os.environ`` plus the launch's variables, spelled exactly as ``accelerando launch`` writes them.

    The plan's variables win: the helpers below only add names the plan does not write, so a
    process started by these helpers reads the same values (and the same echoed defaults) as one
    started by the launcher.
    """
    extra = _reference_env(settings)
    if settings["mixed_precision"] == "fp8":
        setup_fp8_env(args, extra)
    prepare_extend_env_parallelism_config(args, extra)
    return {**os.environ, **extra, **plan.env}


# --- the reference's helpers ----------------------------------------------------------------------


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Build the command and environment of a launch that runs the script in one process per machine.

    Args:
        args: the launch namespace (``training_script``, ``training_script_args``, ``module``,
            ``no_python``, ``mixed_precision``, ``cpu``, ``num_processes``, ``num_machines``, ...).

    Returns:
        ``(cmd, env)``: ``[python, script, *script_args]`` (``python -m module``, or the program alone
        with ``no_python``; behind ``mpirun`` and its options with ``mpirun_hostfile``) and a copy of
        ``os.environ`` with the launch's variables added, among them ``ACCELERATE_MIXED_PRECISION``,
        ``ACCELERATE_USE_CPU``, ``KMP_AFFINITY`` / ``KMP_BLOCKTIME`` on CPU (unless already set) and,
        for several processes or machines, ``MASTER_ADDR`` / ``MASTER_PORT``.

    Raises:
        ValueError: for contradictory settings, a missing script, or ``module`` with ``no_python``.
        OSError: ``mpirun_hostfile`` is given but there is no ``mpirun`` on ``PATH``.
    """
    settings = _settings_from_args(args)
    command = _command(args)
    python = sys.executable
    if command.no_python:
        cmd = [command.target, *command.args]
    elif command.module:
        cmd = [python, "-m", command.target, *command.args]
    else:
        cmd = [python, command.target, *command.args]
    plan = _plan(args, settings)
    if plan.mode == "mpirun":
        cmd = list(plan.argv)  # mpirun starts every process of the multi-CPU job
    env = _process_env(args, settings, plan)
    if "ACCELERATE_USE_CPU" not in plan.env:
        env["ACCELERATE_USE_CPU"] = _text(bool(settings["cpu"]))

    machines = machine_range(settings["num_machines"])[1]
    port = str(settings["main_process_port"] or _DEFAULT_MAIN_PORT)
    if machines > 1:
        env["MASTER_ADDR"] = str(settings["main_process_ip"])
        env["MASTER_PORT"] = port
    elif (settings["num_processes"] or 1) > 1:
        env["MASTER_ADDR"] = settings["main_process_ip"] or "127.0.0.1"
        env["MASTER_PORT"] = port
    if settings["num_cpu_threads_per_process"] is not None:
        env["OMP_NUM_THREADS"] = str(settings["num_cpu_threads_per_process"])
    if settings["cpu"]:  # Intel OpenMP: pin threads and let them sleep soon, as the reference's CPU launch
        env.setdefault("KMP_AFFINITY", "granularity=fine,compact,1,0")
        env.setdefault("KMP_BLOCKTIME", "1")
    return cmd, env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Prepare a launch through ``torch.distributed.run`` (several processes and/or machines).

    Besides returning the environment, the agent's options are stored on ``args`` under
    ``torch.distributed.run``'s names (``nnodes``, ``nproc_per_node``, ``node_rank``, ``master_addr``
    and ``master_port`` or ``rdzv_backend`` and ``rdzv_endpoint``, ``max_restarts``,
    ``monitor_interval``), so ``torch.distributed.run.run(args)`` can start the processes.

    Args:
        args: the launch namespace; changed in place as described.

    Returns:
        A copy of ``os.environ`` with the launch's variables: ``ACCELERANDO_*``, the reference's names
        (``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_USE_FSDP`` and the ``FSDP_*`` options, the
        dynamo options, ...), ``CUDA_VISIBLE_DEVICES`` for ``gpu_ids``, ``OMP_NUM_THREADS``, and
        ``NCCL_P2P_DISABLE`` / ``NCCL_IB_DISABLE`` on GPUs that hang with them.

    Raises:
        ValueError: for contradictory settings (e.g. GPUs asked for on a machine without any).
    """
    settings = _settings_from_args(args)
    plan = _plan(args, settings, required=False)
    if plan.mode != "elastic":
        restarts = max(1, settings["max_restarts"])
        plan = _plan(args, _settings_from_args(args, max_restarts=restarts), required=False)
        plan = _with_restarts(plan, settings["max_restarts"])
    _set_agent_args(args, plan)
    env = _process_env(args, settings, plan)
    if settings["use_fsdp"] and "ACCELERATE_USE_FSDP" not in plan.env:
        env["ACCELERATE_USE_FSDP"] = "true"
    if not settings["cpu"] and not check_cuda_p2p_ib_support():
        logger.warning(
            "These GPUs hang with NCCL peer-to-peer and InfiniBand transfers on this driver: disabling both "
            "(NCCL_P2P_DISABLE=1, NCCL_IB_DISABLE=1). A driver of 550.40.07 or later makes them usable."
        )
        env["NCCL_P2P_DISABLE"] = "1"
        env["NCCL_IB_DISABLE"] = "1"
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Prepare a DeepSpeed launch: DeepSpeed's own multi-machine runner, or ``torch.distributed.run``.

    On several machines with a ``deepspeed_multinode_launcher`` other than ``standard``, the main machine
    starts every host through DeepSpeed's runner (``pdsh`` by default); otherwise each machine starts its
    processes with ``torch.distributed.run`` and, as for :func:`prepare_multi_gpu_env`, the agent's
    options are stored on ``args``.

    Args:
        args: the launch namespace (``use_deepspeed`` is implied).

    Returns:
        ``(cmd, env)``: the command line that starts the job and a copy of ``os.environ`` with the
        launch's variables (``ACCELERATE_USE_DEEPSPEED=true``, ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, the
        offload options, ``ACCELERATE_DEEPSPEED_CONFIG_FILE``, ...). For DeepSpeed's runner, write the
        environment to ``.deepspeed_env`` (:func:`~accelerando.common.environment.convert_dict_to_env_variables`)
        so the other hosts get it.

    Raises:
        ValueError: for contradictory settings or an unknown multi-node launcher.
    """
    launcher = getattr(args, "deepspeed_multinode_launcher", None)
    if launcher is not None and launcher not in DEEPSPEED_MULTINODE_LAUNCHERS:
        raise ValueError(
            f"deepspeed_multinode_launcher={launcher!r} is not one of {DEEPSPEED_MULTINODE_LAUNCHERS}. Fix: "
            "choose one of them."
        )
    settings = _settings_from_args(args, use_deepspeed=True)
    plan = _plan(args, settings)
    if plan.mode == "elastic":
        _set_agent_args(args, plan)
    env = _process_env(args, settings, plan)
    if "ACCELERATE_USE_DEEPSPEED" not in plan.env:
        env["ACCELERATE_USE_DEEPSPEED"] = "true"
    return list(plan.argv), env
