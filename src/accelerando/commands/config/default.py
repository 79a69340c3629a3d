"""``accelerando config default``: write a basic config file for this machine without questions."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from accelerando.commands.config.config_args import default_json_config_file
from accelerando.commands.config.config_utils import SubcommandHelpFormatter
from accelerando.core.settings.configfile import (
    ConfigError,
    config_to_layer,
    default_config_path,
    settings_to_config,
    write_config_file,
)
from accelerando.core.settings.machine import visible_gpu_count
from accelerando.core.settings.resolve import parse_value

__all__ = [
    "basic_config_values",
    "default_command_parser",
    "default_config_command",
    "default_json_config_file",
    "description",
    "write_basic_config",
]

description = "Create a default config file for accelerando with only a few flags set."


def basic_config_values(mixed_precision: str = "no", gpu_count: int | None = None) -> dict[str, object]:
    """Setting values of a sane single-machine config for a machine with ``gpu_count`` GPUs.

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.
        gpu_count: GPUs on the machine; ``None`` counts them (without initialising CUDA).

    Returns:
        Setting name -> value: all GPUs with data parallelism when there are several, one GPU when
        there is one, one CPU process otherwise.

    Raises:
        ValueError: for an unknown ``mixed_precision``.
    """
    precision = parse_value("mixed_precision", mixed_precision, "write_basic_config(mixed_precision=...)")
    gpus = visible_gpu_count() if gpu_count is None else gpu_count
    return {
        "mixed_precision": precision,
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": max(1, gpus),
        "distributed_type": "MULTI_GPU" if gpus > 1 else "NO",
        "cpu": gpus == 0,
        "gpu_ids": "all",
        "debug": False,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "dynamo_backend": "NO",
    }


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None, use_xpu: bool = False
) -> Path | bool:
    """Write a basic config file for this machine, unless one already exists there.

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.
        save_location: where to write (``.json`` for JSON, else YAML); ``None`` = the default location
            (see :func:`accelerando.core.settings.configfile.default_config_path`).
        use_xpu: accepted for compatibility; Intel XPUs are not detected here.

    Returns:
        The path written, or ``False`` when a file already exists at ``save_location`` (it is kept).

    Raises:
        ValueError: for an unknown ``mixed_precision``.

    Example:
        >>> from accelerando.utils import write_basic_config
        >>> path = write_basic_config(mixed_precision="bf16", save_location="default_config.yaml")
        >>> write_basic_config(save_location="default_config.yaml")  # an existing file is kept
        Config file already exists at default_config.yaml; not overwriting it. Fix: delete it first or pass another path.
        False
    """
    del use_xpu  # the basic config does not depend on it here
    path = Path(save_location).expanduser() if save_location is not None else default_config_path()
    values = basic_config_values(mixed_precision)
    if path.exists():
        print(
            f"Config file already exists at {path}; not overwriting it. Fix: delete it first or pass another path."
        )
        return False
    data = settings_to_config(values)
    config_to_layer(data, str(path))  # what we write must load
    return write_config_file(data, path)


def default_command_parser(
    parser: argparse._SubParsersAction[argparse.ArgumentParser], parents: Sequence[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """Register ``default`` on the subcommands of ``accelerando config``.

    Args:
        parser: the object returned by ``add_subparsers()`` of the ``config`` parser.
        parents: parsers whose options ``default`` shares (``--config_file``).

    Returns:
        The new subparser (its ``func`` is :func:`default_config_command`).
    """
    sub = parser.add_parser(
        "default",
        parents=list(parents),
        help=description,
        description=description,
        formatter_class=SubcommandHelpFormatter,
    )
    sub.add_argument(
        "--save_location",
        dest="config_file",
        default=argparse.SUPPRESS,
        help="Same as --config_file: where to write the file.",
    )
    sub.add_argument(
        "--mixed_precision",
        choices=["no", "fp16", "bf16", "fp8"],
        default="no",
        help=(
            "Mixed precision to write (default: no). Each runs on CPU and GPU; natively: bf16 on GPUs "
            "from Ampere and CPUs with bf16 kernels (AVX512/AMX, Arm bf16), fp16 on GPUs, fp8 on GPUs of "
            "compute capability 8.9+. Elsewhere they are emulated, slower than no, and a run warns once."
        ),
    )
    sub.set_defaults(func=default_config_command, config_command="default")
    return sub


def default_config_command(args: argparse.Namespace) -> int:
    """Write the basic config file named by ``args.config_file`` (default location when ``None``).

    Args:
        args: parsed arguments (``config_file``, ``mixed_precision``).

    Returns:
        0 when written, 1 when a file already exists there, 2 for an invalid value.
    """
    try:
        written = write_basic_config(args.mixed_precision, getattr(args, "config_file", None))
    except (ConfigError, ValueError) as err:
        print(f"accelerando config default: {err}", file=sys.stderr)
        return 2
    if written is False:
        return 1
    print(f"Config file written to {written}")
    return 0
