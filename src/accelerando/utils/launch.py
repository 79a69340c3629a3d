"""The reference's launch helpers (``accelerate.utils.launch``) over accelerando's launch planning.

Each ``prepare_*`` function takes the ``argparse.Namespace`` of a launch command (the reference's
attribute names: ``training_script``, ``num_processes``, ``mixed_precision``, ``use_fsdp``, ...) and
returns the command and/or the environment for the processes, without starting anything. The settings
are resolved and checked by :mod:`accelerando.settings` and the command comes from
:func:`accelerando.launchers.plan.build`, so these helpers and ``accelerando launch`` agree. The
environment carries every given setting twice: under accelerando's ``ACCELERANDO_*`` names and under
the reference's names (``ACCELERATE_MIXED_PRECISION``, ``FSDP_SHARDING_STRATEGY``, ...), which code
written for the reference (transformers among it) reads.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accelerando.settings import environment_setting
from accelerando.settings.fields import FIELDS_BY_NAME
from accelerando.settings.machine import MachineInfo, detect_machine
from accelerando.utils.constants import DEEPSPEED_MULTINODE_LAUNCHERS
from accelerando.utils.environment import check_cuda_p2p_ib_support, get_current_device_type
from accelerando.utils.other import merge_dicts

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "PrepareForLaunch",
    "env_var_path_add",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "setup_fp8_env",
]

logger = logging.getLogger(__name__)

# Namespace attributes of the reference's launch command whose setting has another name here.
_ATTRIBUTE_ALIASES = {"use_cpu": "cpu"}
_DEFAULT_MAIN_PORT = 29500


def env_var_path_add(env_var_name: str, path_to_add: str | os.PathLike[str]) -> str:
    """Return the value of a ``PATH``-like variable with one more entry appended.

    The variable itself is not changed; empty entries of the current value are dropped.

    Args:
        env_var_name: the variable (``"PYTHONPATH"``).
        path_to_add: the folder to append.

    Returns:
        The ``:``-separated (``;`` on Windows) new value.
    """
    entries = [p for p in os.environ.get(env_var_name, "").split(os.pathsep) if p]
    entries.append(str(path_to_add))
    return os.pathsep.join(entries)


# --- namespace -> settings and plan ---------------------------------------------------------------


def _settings_from_args(args: argparse.Namespace, **forced: Any) -> Any:
    """Resolve the settings a launch namespace gives (plus ``forced`` values), checked as the CLI checks them."""
    from accelerando.settings.resolve import Sourced, resolve

    given = vars(args)
    layer: dict[str, Any] = {}
    for attribute, value in given.items():
        name = _ATTRIBUTE_ALIASES.get(attribute, attribute)
        field = FIELDS_BY_NAME.get(name)
        if field is None or value is None:
            continue
        if field.kind == "bool" and value is False and field.switch:
            continue  # an absent switch reads False in a Namespace: "not given"
        if name in layer and not value:
            continue  # `cpu` and `use_cpu` both present: either one true wins
        layer[name] = Sourced(value, f"args.{attribute}")
    for name, value in forced.items():
        layer[name] = Sourced(value, "launcher")
    return resolve([layer], warn_sources=())


def _command(args: argparse.Namespace) -> Any:
    from accelerando.launchers.plan import Command

    script = getattr(args, "training_script", None)
    if not script:
        raise ValueError("The launch namespace has no training_script. Fix: set args.training_script.")
    return Command(
        str(script),
        tuple(str(a) for a in getattr(args, "training_script_args", None) or ()),
        bool(getattr(args, "module", False)),
        bool(getattr(args, "no_python", False)),
    )


def _plan(args: argparse.Namespace, settings: Any, machine: MachineInfo | None = None) -> Any:
    from accelerando.launchers.plan import build

    port = getattr(args, "main_process_port", None)
    return build(
        settings,
        _command(args),
        machine or detect_machine(),
        port=lambda: int(port) if port else _DEFAULT_MAIN_PORT,
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def _reference_env(settings: Any) -> dict[str, str]:
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


def _process_env(args: argparse.Namespace, settings: Any, plan: Any) -> dict[str, str]:
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


# Types torch.distributed.run's parser gives its options (the plan holds them as text).
_AGENT_TYPES: dict[str, Callable[[str], Any]] = {
    "max_restarts": int,
    "monitor_interval": float,
    "master_port": int,
}


def _set_agent_args(args: argparse.Namespace, plan: Any) -> None:
    """Store the plan's ``torch.distributed.run`` options on ``args`` (as torchrun's own parser names them)."""
    agent = plan.agent_args
    index = 0
    while index < len(agent) and agent[index].startswith("--"):
        option = agent[index][2:]
        if "=" in option:
            key, value = option.split("=", 1)
            index += 1
        elif option in ("module", "no_python", "standalone"):
            key, value = option, "true"
            index += 1
        else:
            key, value = option, agent[index + 1]
            index += 2
        setattr(args, key, _AGENT_TYPES.get(key, str)(value) if value != "true" else True)
    args.nproc_per_node = str(plan.nproc_per_node)
    args.nnodes = str(plan.num_machines)
    args.node_rank = int(plan.machine_rank)
    # The agent's other options at their defaults, so that torch.distributed.run.run(args) works.
    from torch.distributed.run import get_args_parser

    for key, value in vars(get_args_parser().parse_args([str(args.training_script)])).items():
        if not hasattr(args, key):
            setattr(args, key, value)


# --- the reference's helpers ----------------------------------------------------------------------


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Build the command and environment of a launch that runs the script in one process per machine.

    Args:
        args: the launch namespace (``training_script``, ``training_script_args``, ``module``,
            ``no_python``, ``mixed_precision``, ``cpu``, ``num_processes``, ``num_machines``, ...).

    Returns:
        ``(cmd, env)``: ``[python, script, *script_args]`` (``python -m module``, or the program alone
        with ``no_python``; behind ``mpirun`` and its options with ``mpirun_hostfile``) and a copy of ``os.environ`` with the launch's variables added, among them
        ``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_USE_CPU`` and, for several processes or machines,
        ``MASTER_ADDR`` / ``MASTER_PORT``.

    Raises:
        ValueError: for contradictory settings, a missing script, ``module`` with ``no_python``, or
            ``mpirun_hostfile`` without a usable ``mpirun`` on ``PATH``.
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
    machines = settings["num_machines"] or 1
    port = str(settings["main_process_port"] or _DEFAULT_MAIN_PORT)
    if machines > 1:
        env["MASTER_ADDR"] = str(settings["main_process_ip"])
        env["MASTER_PORT"] = port
    elif (settings["num_processes"] or 1) > 1:
        env["MASTER_ADDR"] = settings["main_process_ip"] or "127.0.0.1"
        env["MASTER_PORT"] = port
    if settings["num_cpu_threads_per_process"] is not None:
        env["OMP_NUM_THREADS"] = str(settings["num_cpu_threads_per_process"])
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
    plan = _plan(args, settings)
    if plan.mode != "elastic":
        plan = _plan(args, _settings_from_args(args, max_restarts=max(1, settings["max_restarts"])))
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


def _with_restarts(plan: Any, restarts: int) -> Any:
    """The plan of a one-process elastic launch, with the restart count the user asked for."""
    from dataclasses import replace

    argv = list(plan.argv)
    if "--max_restarts" in argv:
        argv[argv.index("--max_restarts") + 1] = str(restarts)
    return replace(plan, argv=tuple(argv))


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
        environment to ``.deepspeed_env`` (:func:`~accelerando.utils.environment.convert_dict_to_env_variables`)
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


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """Add what a TPU (XLA) launch needs to ``current_env``, and to ``args`` for a TPU pod.

    bf16 on XLA is asked for through variables: ``XLA_USE_BF16=1`` (every float in bf16) or, with
    ``downcast_bf16``, ``XLA_DOWNCAST_BF16=1`` (float32 stays in fp32 where XLA allows it).

    Args:
        args: the launch namespace (``mixed_precision``, ``downcast_bf16``, ``debug``; ``tpu_vm`` and
            ``tpu_name`` for a pod).
        current_env: the environment being prepared; changed in place.
        pod: prepare a launch over a TPU pod: ``args.vm`` and ``args.tpu`` are set from ``tpu_vm`` and
            ``tpu_name`` (the names PyTorch/XLA's pod launcher reads).

    Returns:
        ``(args, current_env)``.
    """
    if getattr(args, "mixed_precision", None) == "bf16":
        if getattr(args, "downcast_bf16", False):
            current_env["XLA_DOWNCAST_BF16"] = "1"
        else:
            current_env["XLA_USE_BF16"] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = getattr(args, "tpu_vm", None)
        args.tpu = getattr(args, "tpu_name", None)
    return args, current_env


_FP8_PRECISION_PARTS = ("FPROP", "DGRAD", "WGRAD")


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Add the FP8 options of a launch namespace to ``current_env`` under the reference's names.

    Every ``fp8_<name>`` attribute that is set becomes ``ACCELERATE_FP8_<NAME>``; the three flags of
    ``fp8_override_linear_precision`` become ``ACCELERATE_FP8_OVERRIDE_FPROP`` / ``_DGRAD`` / ``_WGRAD``.
    The attributes ``accelerando launch`` stores them under (``compat_fp8_<name>``) are read too.

    Args:
        args: the launch namespace.
        current_env: the environment being prepared; changed in place.

    Returns:
        ``current_env``.

    Raises:
        ValueError: if ``fp8_override_linear_precision`` does not hold three values.
    """
    for attribute, value in vars(args).items():
        name = attribute[len("compat_") :] if attribute.startswith("compat_fp8_") else attribute
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            parts = value.split(",") if isinstance(value, str) else list(value)
            if len(parts) != 3:
                raise ValueError(
                    f"fp8_override_linear_precision needs three booleans (fprop, dgrad, wgrad), got {value!r}."
                )
            for part, flag in zip(_FP8_PRECISION_PARTS, parts, strict=True):
                current_env[f"ACCELERATE_FP8_OVERRIDE_{part}"] = _text(flag).strip().lower()
        else:
            current_env[f"ACCELERATE_{name.upper()}"] = _text(value)
    return current_env


def prepare_extend_env_parallelism_config(
    args: argparse.Namespace, current_env: dict[str, str]
) -> dict[str, str]:
    """Pass the ``parallelism_config_*`` options of a launch namespace to the processes.

    Each set attribute ``parallelism_config_<name>`` becomes the variable ``PARALLELISM_CONFIG_<NAME>``
    (what :class:`~accelerando.parallelism_config.ParallelismConfig` reads), and
    ``ACCELERATE_USE_PARALLELISM_CONFIG=true`` tells the processes to build one.

    Args:
        args: the launch namespace.
        current_env: the environment being prepared; changed in place.

    Returns:
        ``current_env``.
    """
    given = {
        attribute: value
        for attribute, value in vars(args).items()
        if attribute.startswith("parallelism_config_") and value is not None
    }
    for attribute, value in given.items():
        current_env[attribute.upper()] = _text(value)
    if given:
        current_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    return current_env


# --- SageMaker ------------------------------------------------------------------------------------


def _hyperparameters(script_args: Sequence[str]) -> dict[str, Any]:
    """``["--lr", "0.1", "--fp16", "--name", "x"]`` -> ``{"lr": 0.1, "fp16": True, "name": "x"}``."""
    result: dict[str, Any] = {}
    index = 0
    items = list(script_args)
    while index < len(items):
        token = items[index]
        if not token.startswith("-"):
            raise ValueError(
                f"SageMaker passes script arguments as hyperparameters, so each must be --name [value]; "
                f"{token!r} is a value without a name. Fix: write it as --name {token}."
            )
        key = token.lstrip("-")
        if "=" in key:
            key, raw = key.split("=", 1)
            index += 1
        elif index + 1 < len(items) and not items[index + 1].startswith("-"):
            raw = items[index + 1]
            index += 2
        else:
            result[key] = True
            index += 1
            continue
        try:
            result[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            result[key] = raw
    return result


def _read_table(path: str | os.PathLike[str], what: str) -> list[list[str]]:
    """Rows of a tab-separated file with a header line (which is skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    for number, row in enumerate(rows, start=2):
        if len(row) < 2:
            raise ValueError(f"{what} file {path}: line {number} needs two tab-separated columns.")
    return rows


def prepare_sagemager_args_inputs(
    sagemaker_config: Any, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Build the keyword arguments of a SageMaker ``HuggingFace`` estimator for a launch.

    Sets ``AWS_DEFAULT_REGION`` and the credentials (``AWS_PROFILE``, or the access keys from
    ``args.aws_access_key_id`` / ``args.aws_secret_access_key``) in ``os.environ``, as the SageMaker
    SDK reads them from there.

    Args:
        sagemaker_config: the SageMaker section of a config file (``region``, ``profile``,
            ``iam_role_name``, ``ec2_instance_type``, ``num_machines``, ``base_job_name``, ``image_uri``,
            ``py_version``, ``pytorch_version``, ``transformers_version``, ``distributed_type``,
            ``sagemaker_inputs_file``, ``sagemaker_metrics_file``, ``additional_args``).
        args: the launch namespace (``training_script`` must be a ``.py`` file; its arguments become
            hyperparameters).

    Returns:
        ``(estimator_kwargs, inputs)``: the estimator's arguments (entry point, source folder, role,
        versions, instances, distribution, hyperparameters, environment, metric definitions) and the
        training inputs read from ``sagemaker_inputs_file`` (None without one).

    Raises:
        OSError: without a profile or access keys.
        ValueError: for a script that is not a Python file, or an unknown mixed precision or dynamo
            backend.
    """
    from accelerando.enums import DynamoBackend, PrecisionType

    os.environ["AWS_DEFAULT_REGION"] = str(sagemaker_config.region)
    if getattr(sagemaker_config, "profile", None):
        os.environ["AWS_PROFILE"] = str(sagemaker_config.profile)
    elif getattr(args, "aws_access_key_id", None) and getattr(args, "aws_secret_access_key", None):
        os.environ["AWS_ACCESS_KEY_ID"] = args.aws_access_key_id
        os.environ["AWS_SECRET_ACCESS_KEY"] = args.aws_secret_access_key
    else:
        raise OSError(
            "SageMaker needs AWS credentials. Fix: set `profile` in the SageMaker config, or pass "
            "--aws_access_key_id and --aws_secret_access_key."
        )
    script = Path(args.training_script)
    if script.suffix != ".py":
        raise ValueError(f"SageMaker runs a Python script; {script.name!r} is not a .py file.")
    precision_text = str(getattr(args, "mixed_precision", None) or "no").lower()
    dynamo_text = str(getattr(args, "dynamo_backend", None) or "no").upper()
    if precision_text not in PrecisionType.list():
        raise ValueError(f"mixed_precision {precision_text!r} is not one of {PrecisionType.list()}.")
    if dynamo_text not in DynamoBackend.list():
        raise ValueError(f"dynamo_backend {dynamo_text!r} is not one of {DynamoBackend.list()}.")
    distributed_type = str(getattr(sagemaker_config, "distributed_type", "NO"))
    environment = {
        "ACCELERATE_USE_SAGEMAKER": "true",
        "ACCELERATE_MIXED_PRECISION": precision_text,
        "ACCELERATE_DYNAMO_BACKEND": dynamo_text,
        "ACCELERATE_DYNAMO_MODE": str(getattr(args, "dynamo_mode", None) or "default"),
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": _text(bool(getattr(args, "dynamo_use_fullgraph", False))),
        "ACCELERATE_DYNAMO_USE_DYNAMIC": _text(bool(getattr(args, "dynamo_use_dynamic", False))),
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": _text(
            bool(getattr(args, "dynamo_use_regional_compilation", False))
        ),
        "ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE": distributed_type,
    }
    if precision_text == "fp8":
        setup_fp8_env(args, environment)
    distribution = None
    if distributed_type == "DATA_PARALLEL":
        distribution = {"smdistributed": {"dataparallel": {"enabled": True}}}
    inputs = None
    if getattr(sagemaker_config, "sagemaker_inputs_file", None):
        inputs = {
            row[0]: row[1] for row in _read_table(sagemaker_config.sagemaker_inputs_file, "SageMaker inputs")
        }
    metrics = None
    if getattr(sagemaker_config, "sagemaker_metrics_file", None):
        metrics = [
            {"Name": row[0], "Regex": row[1]}
            for row in _read_table(sagemaker_config.sagemaker_metrics_file, "SageMaker metrics")
        ]
    estimator: dict[str, Any] = {
        "image_uri": getattr(sagemaker_config, "image_uri", None),
        "entry_point": script.name,
        "source_dir": str(script.parent) if str(script.parent) else ".",
        "role": sagemaker_config.iam_role_name,
        "transformers_version": sagemaker_config.transformers_version,
        "pytorch_version": sagemaker_config.pytorch_version,
        "py_version": sagemaker_config.py_version,
        "base_job_name": sagemaker_config.base_job_name,
        "instance_count": sagemaker_config.num_machines,
        "instance_type": sagemaker_config.ec2_instance_type,
        "debugger_hook_config": False,
        "distribution": distribution,
        "hyperparameters": _hyperparameters(getattr(args, "training_script_args", None) or ()),
        "environment": environment,
        "metric_definitions": metrics,
    }
    additional = getattr(sagemaker_config, "additional_args", None)
    if additional:
        estimator = dict(merge_dicts(additional, estimator))
    return estimator, inputs


# --- forked processes -----------------------------------------------------------------------------

# Distributed types whose forked processes need LOCAL_RANK / RANK (every multi-process type but XLA).
_RANKED_TYPES = frozenset(
    {
        "MULTI_GPU",
        "MULTI_NPU",
        "MULTI_MLU",
        "MULTI_SDAA",
        "MULTI_MUSA",
        "MULTI_XPU",
        "MULTI_CPU",
        "MULTI_HPU",
        "MULTI_NEURON",
        "DEEPSPEED",
        "FSDP",
        "MEGATRON_LM",
        "TP",
    }
)


class PrepareForLaunch:
    """Wrap a function so that each process forked by ``torch.multiprocessing`` knows its rank.

    ``torch.multiprocessing.start_processes(PrepareForLaunch(fn, "MULTI_GPU"), args, nprocs=n)`` calls
    the object with the process index first: it sets ``LOCAL_RANK`` (the index), ``RANK``
    (``NPROC * NODE_RANK + index``, from those variables) and ``FORK_LAUNCHED=1`` in that process's
    environment, then calls ``fn(*args)``.

    Args:
        launcher: the function each process runs.
        distributed_type: the job's distributed type (a ``DistributedType`` or its name); ranks are
            set for every multi-process type except XLA (which numbers its processes itself).
        debug: on an exception, log it with the process's rank and the traceback, and record it in
            the file named by ``ACCELERATE_DEBUG_RDV_FILE`` when set, before re-raising.
    """

    def __init__(
        self, launcher: Callable[..., Any], distributed_type: Any = "NO", debug: bool = False
    ) -> None:
        self.launcher = launcher
        self.distributed_type = str(getattr(distributed_type, "value", distributed_type))
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> Any:
        """Set this process's rank variables and run the function.

        Args:
            index: the process's index among those forked on this machine.
            *args: the function's arguments.

        Returns:
            What the function returns.
        """
        if self.distributed_type in _RANKED_TYPES:
            nproc = int(os.environ.get("NPROC", 1))
            node_rank = int(os.environ.get("NODE_RANK", 0))
            os.environ["LOCAL_RANK"] = str(index)
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        if not self.debug:
            return self.launcher(*args)
        try:
            return self.launcher(*args)
        except Exception:
            rank = os.environ.get("RANK", str(index))
            details = traceback.format_exc()
            logger.error("Process %s (index %d) failed:\n%s", rank, index, details)
            record = environment_setting("debug_rdv_file")
            if record:
                with open(record, "a", encoding="utf-8") as handle:
                    handle.write(f"rank {rank}:\n{details}\n")
            raise

    def __repr__(self) -> str:
        return f"PrepareForLaunch({self.launcher!r}, distributed_type={self.distributed_type!r}, debug={self.debug})"
