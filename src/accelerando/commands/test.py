"""``accelerando test``: run the bundled end-to-end check under the current configuration.

It is ``accelerando launch [--config_file FILE] <bundled test_script.py>``: the same settings
resolution and launch path a user's script gets, so a pass means the configuration works here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``accelerando test``.

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = subparsers.add_parser("test", help="Check that training works with the current configuration.")
    parser.add_argument("--config_file", default=None, help="Config file to test (default: the default one).")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Launch the bundled check script and report the outcome.

    Args:
        args: the parsed arguments (``config_file``).

    Returns:
        0 when every check passed, else the launch's exit status.
    """
    from accelerando.commands import launch
    from accelerando.test_utils.scripts import script_path

    flags = ["--config_file", args.config_file] if args.config_file else []
    launch_args = launch.parse(launch.build_parser(), [*flags, str(script_path())])
    status = launch.run(launch_args)
    verdict = "passed" if status == 0 else f"FAILED (exit status {status})"
    print(f"accelerando test {verdict}.", file=sys.stderr if status else sys.stdout)
    return status
