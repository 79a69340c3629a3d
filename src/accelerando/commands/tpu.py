"""``accelerando tpu-config``: run setup commands on every worker of a Cloud TPU pod through gcloud.

The command builds ``gcloud compute tpus tpu-vm ssh <tpu> --zone <zone> --command "<cmds>" --worker
all``; the commands start with ``cd /usr/share`` (and ``pip install accelerando`` with
``--install_accelerate``). ``--debug`` prints the command instead of running it, which works on any
machine; running it needs the Google Cloud CLI (``gcloud``) on the PATH. TPU name, zone and commands
default to the ``tpu_name``, ``tpu_zone``, ``commands`` and ``command_file`` keys of the config file.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

from accelerando.commands.config.config_args import ClusterConfig, default_config_file, load_config_from_file
from accelerando.commands.utils import CustomArgumentParser
from accelerando.core.settings.configfile import find_config_file

__all__ = [
    "add_parser",
    "build_tpu_command",
    "default_config_file",
    "main",
    "run",
    "tpu_command_launcher",
    "tpu_command_parser",
]

_DESCRIPTION = "Run commands on every worker of a Cloud TPU pod (through gcloud), e.g. to install packages."
_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d*)?(\.post\d+|\.dev\d+)?$")


class TPUConfigError(ValueError):
    """The options do not say which TPU to use or what to run; the message names the fix."""


def tpu_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build the ``tpu-config`` parser with the reference's flags.

    Args:
        subparsers: the ``add_subparsers()`` object to register on; ``None`` makes a stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`tpu_command_launcher`).
    """
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", help=_DESCRIPTION, description=_DESCRIPTION)
    else:
        parser = CustomArgumentParser("accelerando tpu-config", description=_DESCRIPTION)
    config = parser.add_argument_group("Config", "Options that default to the config file's values.")
    config.add_argument("--config_file", default=None, help="Config file to read defaults from.")
    config.add_argument("--tpu_name", default=None, help="Name of the TPU (default: tpu_name in the config).")
    config.add_argument("--tpu_zone", default=None, help="Zone of the TPU (default: tpu_zone in the config).")
    pod = parser.add_argument_group("TPU pod", "What to run on the pod's workers.")
    pod.add_argument("--use_alpha", action="store_true", help="Use `gcloud alpha` instead of `gcloud`.")
    pod.add_argument("--command_file", default=None, help="File with one command per line to run on the pod.")
    pod.add_argument(
        "--command",
        action="append",
        nargs="+",
        help="A command to run on the pod; repeat the flag for several.",
    )
    pod.add_argument(
        "--install_accelerate", action="store_true", help="Install accelerando on the pod first."
    )
    pod.add_argument(
        "--accelerate_version",
        default="latest",
        help="Version to install with --install_accelerate: latest (default), a version such as 0.1.0, "
        "or any pip requirement (a path, a URL).",
    )
    pod.add_argument("--debug", action="store_true", help="Print the gcloud command instead of running it.")
    parser.set_defaults(func=tpu_command_launcher)
    return parser


def _install_requirement(version: str) -> str:
    if version == "latest":
        return "accelerando -U"
    if version == "dev":
        raise TPUConfigError(
            "--accelerate_version dev (install from the reference's GitHub) does not apply to accelerando. "
            "Fix: pass latest, a version, or a pip requirement (e.g. a wheel path or git URL)."
        )
    return f"accelerando=={version}" if _VERSION.match(version) else version


def _fill_from_config(args: argparse.Namespace) -> None:

    path, _ = find_config_file(args.config_file)
    if path is None:
        return

    defaults = load_config_from_file(str(path))
    if not isinstance(defaults, ClusterConfig):
        return
    if not args.command_file and not args.command and defaults.command_file:
        args.command_file = defaults.command_file
    if not args.command and defaults.commands:
        args.command = [list(defaults.commands)]
    args.tpu_name = args.tpu_name or defaults.tpu_name
    args.tpu_zone = args.tpu_zone or defaults.tpu_zone


def build_tpu_command(args: argparse.Namespace) -> list[str]:
    """Build the gcloud command line for parsed ``tpu-config`` arguments (config defaults applied).

    Args:
        args: parsed arguments of :func:`tpu_command_parser`.

    Returns:
        The argument list, starting with ``gcloud``.

    Raises:
        TPUConfigError: no command, no TPU name or no zone (from the flags or the config file).
        ConfigError: the config file is invalid.
        FileNotFoundError: ``--config_file`` or ``--command_file`` does not exist.
    """
    _fill_from_config(args)
    commands: list[str] = []
    if args.command_file:
        with open(args.command_file, encoding="utf-8") as handle:
            commands = [line for line in handle.read().splitlines() if line.strip()]
    elif args.command:
        commands = [" ".join(part) if isinstance(part, list) else str(part) for part in args.command]
    if not commands:
        raise TPUConfigError(
            "Nothing to run on the pod. Fix: pass --command CMD (repeatable) or --command_file FILE, or set "
            "commands / command_file in the config file."
        )
    missing = [
        flag for flag, value in (("--tpu_name", args.tpu_name), ("--tpu_zone", args.tpu_zone)) if not value
    ]
    if missing:
        raise TPUConfigError(
            f"Which TPU is not known. Fix: pass {' and '.join(missing)}, or set tpu_name / tpu_zone in the config file."
        )
    steps = ["cd /usr/share"]
    if args.install_accelerate:
        steps.append(f"pip install {_install_requirement(args.accelerate_version)}")
    steps += commands
    command = ["gcloud", *(["alpha"] if args.use_alpha else [])]
    command += ["compute", "tpus", "tpu-vm", "ssh", args.tpu_name, "--zone", args.tpu_zone]
    return [*command, "--command", "; ".join(steps), "--worker", "all"]


def tpu_command_launcher(args: argparse.Namespace) -> int:
    """Build the gcloud command and run it (or print it with ``--debug``).

    Args:
        args: parsed arguments of :func:`tpu_command_parser`.

    Returns:
        0 on success (or after printing ``Running gcloud ...`` with ``--debug``: the words
        joined by spaces, as the reference prints them); 2 for missing options or a bad config
        file; 1 when gcloud is not installed; otherwise gcloud's exit status.
    """
    try:
        command = build_tpu_command(args)
    except (ValueError, FileNotFoundError) as err:  # TPUConfigError and ConfigError are ValueErrors
        print(f"accelerando tpu-config: {err}", file=sys.stderr)
        return 2
    if args.debug:
        # The reference's wording: the words joined by spaces, unquoted (a log line, not a shell line).
        print(f"Running {' '.join(command)}")
        return 0
    if shutil.which(command[0]) is None:
        print(
            "accelerando tpu-config: the Google Cloud CLI (gcloud) is not on the PATH, so the command cannot "
            "run here. Fix: install it (https://cloud.google.com/sdk/docs/install) and run `gcloud auth login`, "
            "or pass --debug to print the command.",
            file=sys.stderr,
        )
        return 1
    status = subprocess.run(command, check=False, env=os.environ.copy()).returncode
    if status == 0:
        print("Successfully set up the pod.")
    return status


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando tpu-config`` (see :func:`tpu_command_parser`).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    return tpu_command_parser(subparsers)


def run(args: argparse.Namespace) -> int:
    """Same as :func:`tpu_command_launcher`."""
    return tpu_command_launcher(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m accelerando.commands.tpu``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    return tpu_command_launcher(tpu_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
