"""``accelerando config``: write the config file that ``accelerando launch`` reads.

* ``accelerando config``: asks questions in the terminal (questionary) and writes the answers.
* ``accelerando config default [--mixed_precision bf16]``: writes a sane file for this machine.
* ``accelerando config update``: rewrites an old file with current keys, keeping its values.

Every file written is validated with the same rules ``accelerando launch`` applies when reading it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from accelerando.settings.configfile import (
    ConfigError,
    config_to_layer,
    default_config_path,
    migrate_config,
    read_config_file,
    settings_to_config,
    write_config_file,
)
from accelerando.settings.machine import visible_gpu_count
from accelerando.settings.resolve import parse_value

__all__ = ["add_parser", "run", "write_basic_config", "basic_config_values", "ask_questions"]


def basic_config_values(mixed_precision: str = "no", gpu_count: int | None = None) -> dict[str, Any]:
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
    values: dict[str, Any] = {
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
    return values


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None, use_xpu: bool = False
) -> Path | bool:
    """Write a basic config file for this machine, unless one already exists there.

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.
        save_location: where to write (``.json`` for JSON, else YAML); ``None`` = the default location
            (see :func:`accelerando.settings.configfile.default_config_path`).
        use_xpu: accepted for compatibility; Intel XPUs are not detected here.

    Returns:
        The path written, or ``False`` when a file already exists at ``save_location`` (it is kept).

    Raises:
        ValueError: for an unknown ``mixed_precision``.
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


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``accelerando config`` and its ``default`` / ``update`` subcommands.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = subparsers.add_parser("config", help="Create or update a config file.")
    parser.add_argument("--config_file", default=None, help="File to write (default: the default location).")
    sub = parser.add_subparsers(dest="config_command")
    default = sub.add_parser("default", help="Write a basic config file for this machine without questions.")
    default.add_argument("--config_file", "--save_location", dest="sub_config_file", default=None)
    default.add_argument("--mixed_precision", default="no", help="no, fp16, bf16 or fp8.")
    update = sub.add_parser(
        "update", help="Rewrite an existing config file with current keys, keeping values."
    )
    update.add_argument("--config_file", dest="sub_config_file", default=None)
    parser.set_defaults(func=run)
    return parser


def _target(args: argparse.Namespace) -> Path:
    given = getattr(args, "sub_config_file", None) or args.config_file
    return Path(given).expanduser() if given else default_config_path()


def _update(path: Path) -> int:
    if not path.is_file():
        print(f"accelerando config update: {path} does not exist. Fix: pass --config_file.", file=sys.stderr)
        return 2
    data = migrate_config(read_config_file(path))
    config_to_layer(data, str(path))
    write_config_file(data, path)
    print(f"Config file updated: {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Execute ``accelerando config [default|update]``.

    Args:
        args: the parsed arguments.

    Returns:
        0 on success, 2 for an invalid file or answer (the message says why).
    """
    path = _target(args)
    try:
        if args.config_command == "update":
            return _update(path)
        if args.config_command == "default":
            written = write_basic_config(args.mixed_precision, path)
            if written is False:
                return 1
        else:
            try:
                import questionary  # noqa: F401 - checked here to give the install fix
            except ImportError:
                print("accelerando config: the questions need questionary. Fix: `pip install questionary`, "
                      "or run `accelerando config default`.", file=sys.stderr)  # fmt: skip
                return 2
            values = ask_questions()
            if values is None:
                print("accelerando config: cancelled; nothing written.", file=sys.stderr)
                return 1
            data = settings_to_config(values)
            config_to_layer(data, str(path))
            written = write_config_file(data, path)
    except (ConfigError, ValueError) as err:
        print(f"accelerando config: {err}", file=sys.stderr)
        return 2
    print(f"Config file written to {written}")
    return 0


def ask_questions() -> dict[str, Any] | None:
    """Ask the interactive questions (see :mod:`accelerando.commands.config_questions`).

    Returns:
        Setting name -> value, or ``None`` when the user cancelled.
    """
    from accelerando.commands.config_questions import ask_questions as ask

    return ask()
