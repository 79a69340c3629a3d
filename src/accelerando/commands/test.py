"""``accelerando test``: run the bundled end-to-end check under the current configuration.

It is ``accelerando launch [--config_file FILE] <bundled test_script.py>``: the same settings
resolution and launch path a user's script gets, so a pass means the configuration works here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from accelerando.commands import launch
from accelerando.commands.utils import CustomArgumentParser
from accelerando.test_utils.scripts import script_path

__all__ = ["add_parser", "main", "run", "test_command", "test_command_parser"]

_HELP = "Check that training works with the current configuration."


def test_command_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """Build the ``test`` parser (``--config_file``).

    Args:
        subparsers: the ``add_subparsers()`` object to register on; ``None`` makes a stand-alone parser.

    Returns:
        The parser (its ``func`` is :func:`test_command`).
    """
    if subparsers is not None:
        parser = subparsers.add_parser("test", help=_HELP, description=_HELP)
    else:
        parser = CustomArgumentParser("accelerando test", description=_HELP)
    parser.add_argument("--config_file", default=None, help="Config file to test (default: the default one).")
    parser.set_defaults(func=test_command)
    return parser


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``accelerando test`` (see :func:`test_command_parser`).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    return test_command_parser(subparsers)


def test_command(args: argparse.Namespace) -> int:
    """Launch the bundled check script and report the outcome.

    Args:
        args: the parsed arguments (``config_file``).

    Returns:
        0 when every check passed, else the launch's exit status.
    """
    flags = ["--config_file", args.config_file] if args.config_file else []
    launch_args = launch.parse(launch.build_parser(), [*flags, str(script_path())])
    status = launch.run(launch_args)
    verdict = "passed" if status == 0 else f"FAILED (exit status {status})"
    print(f"accelerando test {verdict}.", file=sys.stderr if status else sys.stdout)
    return status


def run(args: argparse.Namespace) -> int:
    """Same as :func:`test_command`."""
    return test_command(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m accelerando.commands.test``.

    Args:
        argv: arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    return test_command(test_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
