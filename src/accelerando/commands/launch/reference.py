"""The reference's ``accelerate.commands.launch`` interface, over the same settings, plan and runner.

:func:`launch_command_parser` and :func:`launch_command` behave as ``accelerando launch``; the named
launchers (:func:`simple_launcher`, :func:`multi_gpu_launcher`, :func:`deepspeed_launcher`) check that
the settings make the kind of launch they start, then run it. TPU pods and SageMaker are refused.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from accelerando.commands.launch.entry import run
from accelerando.commands.launch.flags import SAGEMAKER, TPU_POD, refused_message
from accelerando.commands.launch.parser import CustomHelpFormatter, build_parser, unknown_flags_message
from accelerando.commands.launch.resolution import plan_for
from accelerando.core.settings.configfile import default_config_path
from accelerando.core.settings.fields import FIELDS
from accelerando.launchers import runner
from accelerando.launchers.mpirun import MpiRun
from accelerando.launchers.plan import check_files

if TYPE_CHECKING:
    from collections.abc import Mapping

    from accelerando.core.settings.resolve import Settings

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "TORCH_DYNAMO_MODES",
    "default_config_file",
    "deepspeed_launcher",
    "launch_command",
    "launch_command_parser",
    "multi_gpu_launcher",
    "sagemaker_launcher",
    "simple_launcher",
    "tpu_launcher",
    "tpu_pod_launcher",
    "validate_launch_command",
]

#: The reference's lists (facts of its interface), for code that imports them from here.
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
DYNAMO_BACKENDS = [
    "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI", "FX2TRT",
    "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "TVM",
]  # fmt: skip
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]


#: Where the config file is read from when --config_file is not given (it may not exist); made by
#: :func:`__getattr__` on first use.
default_config_file: str


def __getattr__(name: str) -> str:
    """``default_config_file``: where the config file is read from without --config_file (it may not exist).

    Computed on first use, not at import: the launcher itself looks for the file without pathlib.

    Raises:
        AttributeError: for any other name.
    """
    if name != "default_config_file":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = str(default_config_path())
    globals()[name] = value
    return value


def launch_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """The parser of ``launch``: standalone, or registered on a CLI's ``subparsers``.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``, or None for a
            standalone parser.

    Returns:
        The parser; its ``func`` default is :func:`launch_command`.
    """
    if subparsers is None:
        parser = build_parser()
    else:
        parser = subparsers.add_parser("launch", help="Launch a script.", formatter_class=CustomHelpFormatter)
        build_parser(parser)
    parser.set_defaults(func=launch_command)
    return parser


def validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Settings, bool]:
    """Resolve and check the settings of a launch namespace without starting anything.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Returns:
        ``(args, settings, mixed_precision_from_config)``: the same namespace, filled with every
        setting a config file, the environment or a flag gave (as the reference fills it), the resolved
        :class:`~accelerando.core.settings.Settings` (defaults < config file < environment < flags), and
        whether the mixed precision came from the config file.

    Raises:
        ValueError: an unknown or refused flag, a bad config file or value, or an impossible
            combination (the message names the setting, where it came from and the fix).
    """
    extra = list(getattr(args, "unknown_args", None) or [])
    if extra:
        raise ValueError(unknown_flags_message(extra))
    refused = refused_message(args)
    if refused:
        raise ValueError(refused)

    # Nothing starts here: where mpirun is (and which one) matters only to a launch.
    settings, _plan = plan_for(args, find_mpirun=lambda: MpiRun("mpirun", "openmpi"))
    _fill_namespace(args, settings)
    return args, settings, settings.source("mixed_precision").startswith("config:")


def _fill_namespace(args: argparse.Namespace, settings: Settings) -> None:
    """Write into ``args`` every flag's setting that some layer (config file, environment, flag) gave.

    As the reference's validation does, so code reading ``args`` afterwards sees the config file's
    values; settings left at their defaults keep the namespace's value (``None``, ``False``).
    """
    for field in FIELDS:
        if field.cli is None or settings.source(field.name) == "default":
            continue
        value = settings[field.name]
        if value is not None:
            setattr(args, field.name, value)


def _start(
    args: argparse.Namespace, allowed: tuple[str, ...], who: str, forced: Mapping[str, object] | None = None
) -> None:
    """Plan ``args``, check the plan is one ``who`` starts, run it; a failure raises as the reference does."""
    validate_launch_command(args)
    _settings, plan = plan_for(args, forced)
    if plan.mode not in allowed:
        raise ValueError(
            f"{who} starts {' or '.join(allowed)} launches, but these settings make a {plan.mode} launch of "
            f"{plan.num_processes} process(es). Fix: call launch_command(args), which picks the launcher."
        )

    check_files(_settings)
    quiet = bool(getattr(args, "quiet", False))
    code = runner.run(plan, quiet=quiet)
    if code:
        if plan.mode == "simple" and not quiet:
            import subprocess

            raise subprocess.CalledProcessError(code, list(plan.argv))
        raise SystemExit(code)


def simple_launcher(args: argparse.Namespace) -> None:
    """Start the script in one process on this machine (or, with ``mpirun_hostfile``, through mpirun).

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        subprocess.CalledProcessError: the process failed (with ``quiet``: SystemExit with its status).
        ValueError: the settings ask for something else (several processes without mpirun, ...).
    """
    _start(args, ("simple", "mpirun"), "simple_launcher")


def multi_gpu_launcher(args: argparse.Namespace) -> None:
    """Start the processes of a multi-process job through ``torch.distributed.run`` (GPUs or ``--cpu``).

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        SystemExit: a process failed (the status of the first that failed).
        ValueError: the settings make a one-process, mpirun or DeepSpeed-runner launch.
    """
    _start(args, ("elastic",), "multi_gpu_launcher")


def deepspeed_launcher(args: argparse.Namespace) -> None:
    """Start a DeepSpeed job: ``torch.distributed.run`` on each machine, or DeepSpeed's multi-machine runner.

    ``use_deepspeed`` is implied.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        SystemExit: a process failed.
        ValueError: impossible settings (the message names them and the fix).
    """
    _start(args, ("simple", "elastic", "deepspeed"), "deepspeed_launcher", {"use_deepspeed": True})


def tpu_launcher(args: argparse.Namespace) -> None:
    """Run the script's main function in ``num_processes`` TPU processes through torch_xla.

    The script is imported as a module and ``main_training_function`` (``--main_training_function``,
    default ``main``) is started by ``torch_xla.distributed.xla_multiprocessing.spawn``.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        RuntimeError: torch_xla is not installed (TPUs need a TPU VM with torch_xla).
        ValueError: the script has no such function.
    """
    import importlib.util

    if importlib.util.find_spec("torch_xla") is None:
        raise RuntimeError(
            "tpu_launcher runs on TPUs through torch_xla, which is not installed. Fix: run on a TPU VM with "
            "torch_xla installed, or launch on CPUs/GPUs with launch_command."
        )
    import torch_xla.distributed.xla_multiprocessing as xmp  # type: ignore[import-not-found]

    settings, plan = plan_for(args)
    name = getattr(args, "main_training_function", None) or settings.main_training_function
    script = str(args.training_script)
    spec = importlib.util.spec_from_file_location("__accelerando_tpu_main__", script)
    if spec is None or spec.loader is None:
        raise ValueError(f"tpu_launcher cannot import {script!r}. Fix: pass a Python script.")
    module = importlib.util.module_from_spec(spec)
    sys.argv = [script, *(getattr(args, "training_script_args", None) or [])]
    spec.loader.exec_module(module)
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{script} has no function {name!r}. Fix: pass --main_training_function.")
    from accelerando.common.environment import patch_environment
    from accelerando.launchers.reference import PrepareForLaunch

    with patch_environment(**plan.env):
        xmp.spawn(PrepareForLaunch(function), args=(), nprocs=settings.num_processes)


def tpu_pod_launcher(args: argparse.Namespace) -> None:
    """Refuse a TPU-pod launch: starting every worker of a pod needs Google Cloud's gcloud and torch_xla.

    Args:
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        RuntimeError: always; the message says how to run on a pod instead.
    """
    raise RuntimeError(
        f"tpu_pod_launcher: {TPU_POD}. Fix: run `accelerando launch` on every worker of the pod yourself "
        "(e.g. `gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...`)."
    )


def sagemaker_launcher(sagemaker_config: object, args: argparse.Namespace) -> None:
    """Refuse a SageMaker launch: accelerando starts jobs on this machine or a cluster of its own.

    Args:
        sagemaker_config: the SageMaker part of a config file.
        args: a namespace from :func:`launch_command_parser`.

    Raises:
        RuntimeError: always; the message says what to do instead.
    """
    raise RuntimeError(
        f"sagemaker_launcher: {SAGEMAKER}. Fix: run `accelerando launch` inside the SageMaker training job's "
        "own entry point, with a LOCAL_MACHINE config."
    )


def launch_command(args: argparse.Namespace) -> None:
    """Start the launch ``args`` describe, as ``accelerando launch`` does (it picks the launcher).

    Args:
        args: a namespace from :func:`launch_command_parser` (``parser.parse_args(argv)``).

    Raises:
        ValueError: an unknown or refused flag, a bad config file or value, or an impossible
            combination, found before anything starts (see :func:`validate_launch_command`).
        SystemExit: with the exit status, when it is not 0 (a failed process, or 2 for a script or
            file that is missing, which is printed).
    """
    import copy

    validate_launch_command(copy.copy(args))  # raises, as the reference's launch_command does
    code = run(args)
    if code:
        raise SystemExit(code)
