"""``accelerando env``: what a bug report needs: versions, hardware and the settings in effect.

The settings are resolved exactly as ``accelerando launch`` would (defaults < config file <
environment), and every value is printed with its source.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from shutil import which
from typing import TYPE_CHECKING, TypedDict

from accelerando.commands.config.config_args import default_config_file
from accelerando.commands.utils import CustomArgumentParser
from accelerando.core.settings.configfile import ConfigError, find_config_file, load_config_layer
from accelerando.core.settings.fields import machine_range
from accelerando.core.settings.machine import detect_machine
from accelerando.core.settings.resolve import env_layer, resolve
from accelerando.core.version import __version__ as version
from accelerando.launchers.plan import automatic_layout

if TYPE_CHECKING:
    from accelerando.core.settings.resolve import Settings


class Hardware(TypedDict):
    """What :func:`collect_hardware` reports."""

    cpus: int | None
    ram_gib: float
    gpus: list[str]


# The reference's summary keys (they hold spaces and backticks, hence the functional form).
EnvSummary = TypedDict(
    "EnvSummary",
    {
        "`Accelerate` version": "str | None",
        "Platform": "str | None",
        "`accelerate` bash location": str,
        "Python version": "str | None",
        "PyTorch version": "str | None",
        "System RAM": str,
        "`Accelerate` configs": "str | dict[str, object]",
        "status": int,
    },
)

__all__ = [
    "add_parser",
    "collect_hardware",
    "collect_versions",
    "default_config_file",
    "env_command",
    "env_command_parser",
    "main",
    "run",
    "version",
]

_OPTIONAL = ("torch", "numpy", "safetensors", "transformers", "deepspeed", "torchao", "transformer_engine",
             "bitsandbytes", "tensorboard", "wandb", "mlflow", "questionary")  # fmt: skip


def _installed_version(name: str, by_import: dict[str, list[str]] | None) -> str:
    """The version of the package imported as ``name``, found without importing it.

    The distribution of the same name wins; else the distribution that provides the import name
    (``mlflow`` from ``mlflow-skinny``, named in the answer); else ``"installed (version unknown)"``
    when the module can be found at all.
    """
    from importlib import metadata, util

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
    for dist in (by_import or {}).get(name, ()):
        try:
            return f"{metadata.version(dist)} ({dist})"
        except metadata.PackageNotFoundError:
            continue
    try:
        found = util.find_spec(name) is not None  # finds the top-level module; runs none of its code
    except (ImportError, ValueError):
        found = False
    return "installed (version unknown)" if found else "not installed"


def collect_versions() -> dict[str, str]:
    """Return the versions of Python, accelerando and the packages it can use, without importing them.

    A package counts as installed when its import name can be found, whatever its distribution is
    called: ``mlflow`` provided by ``mlflow-skinny`` reads ``"3.1.0 (mlflow-skinny)"``.

    Returns:
        Import name -> version, ``"not installed"`` for a missing package.
    """
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version(), "platform": platform.platform()}
    by_import: dict[str, list[str]] | None = None
    for name in ("accelerando", *_OPTIONAL):
        try:
            versions[name] = metadata.version(name)
            continue
        except metadata.PackageNotFoundError:
            pass
        if by_import is None:  # read every distribution's top-level names once, only when needed
            by_import = dict(metadata.packages_distributions())
        versions[name] = _installed_version(name, by_import)
    return versions


def _gpus() -> list[str]:
    import torch

    from accelerando.core.devices import (
        CUDABackend,  # loads torch: `accelerando env` reports versions without it
    )

    rows = []
    for index in range(CUDABackend.device_count()):
        props = torch.cuda.get_device_properties(index)
        rows.append(f"{index}: {props.name}, {props.total_memory / 2**30:.1f} GiB")
    return rows


def collect_hardware(with_gpus: bool = True) -> Hardware:
    """Return CPU, RAM and GPU facts about this machine.

    Args:
        with_gpus: query GPUs through torch (imports torch; CUDA is queried, not used).

    Returns:
        ``cpus``, ``ram_gib`` and ``gpus`` (one line per GPU with its memory).
    """
    import os

    import psutil

    return {
        "cpus": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": _gpus() if with_gpus else [],
    }


def env_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build the ``env`` parser (``--config_file``, ``--all``).

    Args:
        subparsers: the ``add_subparsers()`` object to register on; ``None`` makes a stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`env_command`).
    """
    help_text = "Print versions, hardware and the settings in effect."
    if subparsers is not None:
        parser = subparsers.add_parser("env", help=help_text, description=help_text)
    else:
        parser = CustomArgumentParser("accelerando env", description=help_text)
    parser.add_argument(
        "--config_file", default=None, help="Config file to inspect (default: the default one)."
    )
    parser.add_argument("--all", action="store_true", help="Also list settings left at their defaults.")
    parser.set_defaults(func=env_command)
    return parser


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando env`` (see :func:`env_command_parser`).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = env_command_parser(subparsers)
    parser.set_defaults(func=run)
    return parser


def env_command(args: argparse.Namespace) -> EnvSummary:
    """Print the environment report and return its summary under the reference's keys.

    Args:
        args: the parsed arguments.

    Returns:
        The reference's summary (``"`Accelerate` version"``, ``"Platform"``, ``"`accelerate` bash
        location"`` (``"Not found"`` when the command is not on ``PATH``), ``"Python version"``,
        ``"PyTorch version"``, ``"System RAM"``, ``"`Accelerate` configs"``) with accelerando's values,
        and ``"status"``: 0, or 2 when the config file is invalid (the message says why).
    """
    versions = collect_versions()
    print("Versions:")
    for name, installed in versions.items():
        print(f"  {name}: {installed}")
    hardware = collect_hardware()
    print(f"Hardware:\n  CPUs: {hardware['cpus']}\n  RAM: {hardware['ram_gib']} GiB")
    print("  GPUs: " + ("none" if not hardware["gpus"] else "\n    " + "\n    ".join(hardware["gpus"])))
    location = which("accelerando") or which("accelerate") or "Not found"
    print(f"Command: {location}")
    info: EnvSummary = {
        "`Accelerate` version": versions.get("accelerando"),
        "Platform": versions.get("platform"),
        "`accelerate` bash location": location,
        "Python version": versions.get("python"),
        "PyTorch version": versions.get("torch"),
        "System RAM": f"{hardware['ram_gib']:.2f} GB",
        "`Accelerate` configs": "Not found",
        "status": 0,
    }
    try:
        path, note = find_config_file(args.config_file)
        settings = resolve([load_config_layer(path) if path else {}, env_layer()], warn_sources=())
    except (ConfigError, ValueError) as err:
        print(f"accelerando env: {err}", file=sys.stderr)
        info["status"] = 2
        return info
    print(f"Config file: {path or 'none (defaults)'}")
    if note:
        print(f"  {note}")
    print("Settings in effect (value [source]):")
    shown = [
        (name, value, source)
        for name, value, source in settings.items()
        if getattr(args, "all", False) or source != "default"
    ]
    for name, value, source in shown:
        print(f"  {name}: {value!r} [{source}]")
    if not shown:
        print("  none (every setting at its default; --all lists them)")
    if path:
        info["`Accelerate` configs"] = {
            name: value for name, value, source in shown if source.startswith("config:")
        }
    if settings.parallelism == "auto":
        _print_layout(settings)
    return info


def _print_layout(settings: Settings) -> None:
    """The automatic parallel layout of these settings (``parallelism: auto``), with its reasons."""
    machine = detect_machine()
    machines = machine_range(settings.num_machines)[1]
    processes = settings.num_processes or max(machine.gpu_count, 1) * machines
    try:
        layout = automatic_layout(settings, machine, processes, machines)
    except ValueError as err:
        print(f"Automatic parallel layout: none fits: {err}")
        return
    if layout is None:
        print("Automatic parallel layout: chosen by the script (no parallelism_model given)")
        return
    print(f"Automatic parallel layout for {processes} process(es): {layout.describe()}")
    for line in layout.reason:
        print(f"  {line}")


def run(args: argparse.Namespace) -> int:
    """``accelerando env``: print the report (:func:`env_command`).

    Returns:
        0, or 2 when the config file is invalid.
    """
    return int(env_command(args)["status"])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m accelerando.commands.env``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    return run(env_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
