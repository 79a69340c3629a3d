"""``accelerando config``: write, create by default, or update the config file ``accelerando launch`` reads.

* ``accelerando config``: asks questions in the terminal (questionary) and writes the answers
  (:mod:`.config`, :mod:`.cluster`, :mod:`.questions`).
* ``accelerando config default [--mixed_precision bf16]``: writes a sane file for this machine
  (:mod:`.default`).
* ``accelerando config update``: rewrites an old file with current keys, keeping its values
  (:mod:`.update`).

Config files load into dataclasses with :func:`load_config_from_file` (:mod:`.config_args`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from accelerando.commands.config.config import config_command, config_command_parser
from accelerando.commands.config.config_args import default_config_file, load_config_from_file
from accelerando.commands.config.default import (
    basic_config_values,
    default_command_parser,
    default_config_command,
    write_basic_config,
)
from accelerando.commands.config.questions import ask_questions as ask
from accelerando.commands.config.update import update_command_parser, update_config_command
from accelerando.commands.spellings import add_dash_spellings

__all__ = [
    "add_parser",
    "ask_questions",
    "basic_config_values",
    "config_command_parser",
    "default_command_parser",
    "default_config_file",
    "get_config_parser",
    "load_config_from_file",
    "main",
    "run",
    "update_command_parser",
    "write_basic_config",
]


def get_config_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build ``accelerando config`` with its ``default`` and ``update`` subcommands.

    ``--config_file`` is accepted before or after the subcommand
    (``config --config_file f default`` and ``config default --config_file f`` are the same).

    Args:
        subparsers: the ``add_subparsers()`` object of the ``accelerando`` parser; ``None`` makes a
            stand-alone parser (``accelerando-config``).

    Returns:
        The ``config`` parser.
    """
    parser = config_command_parser(subparsers)
    shared = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: given after the subcommand it wins, not given it leaves the value before it alone.
    shared.add_argument(
        "--config_file",
        default=argparse.SUPPRESS,
        help="The config file to write or update (default: the default one).",
    )
    commands = parser.add_subparsers(title="subcommands", dest="config_command", metavar="<command>")
    default_command_parser(commands, parents=[shared])
    update_command_parser(commands, parents=[shared])
    return parser


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando config`` on the ``accelerando`` command line.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    return get_config_parser(subparsers)


def run(args: argparse.Namespace) -> int:
    """Execute ``accelerando config [default|update]`` for parsed arguments.

    Args:
        args: the parsed arguments.

    Returns:
        The exit status of the command run (0 on success; see each command).
    """
    command = getattr(args, "config_command", None)
    if command == "default":
        return default_config_command(args)
    if command == "update":
        return update_config_command(args)
    return config_command(args)


def ask_questions() -> dict[str, object] | None:
    """Ask the interactive questions (see :mod:`accelerando.commands.config.questions`).

    Returns:
        Setting name -> value, or ``None`` when the user cancelled.
    """
    return ask()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``accelerando-config`` and ``python -m accelerando.commands.config``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    parser = add_dash_spellings(get_config_parser())
    return run(parser.parse_args(sys.argv[1:] if argv is None else argv))
