"""The reference's module path of the command line: ``accelerate_cli.main`` is ``accelerando``'s main."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["accelerate_console_main", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelerando`` command line (see :func:`accelerando.commands.cli.main`).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status of the subcommand (2 for a usage error).
    """
    from accelerando.commands.cli import main as cli_main

    return cli_main(argv)


def _launch_takes_install_flag() -> bool:
    from accelerando.commands import launch

    parser = launch.build_parser()
    return any("--install_as_accelerate" in action.option_strings for action in parser._actions)


def accelerate_console_main(argv: Sequence[str] | None = None) -> int:
    """Run accelerando's command line under the ``accelerate`` command name.

    ``accelerate launch script.py`` also makes the launched processes import accelerando for
    ``accelerate`` (when the launcher offers ``--install_as_accelerate``), so scripts written for
    Accelerate run unchanged.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The subcommand's exit status.
    """
    from accelerando.commands.cli import main

    args = list(sys.argv[1:] if argv is None else argv)
    from accelerando.core.stand_in import install_as_accelerate

    install_as_accelerate()
    if (
        args
        and args[0] == "launch"
        and "--install_as_accelerate" not in args
        and _launch_takes_install_flag()
    ):
        args.insert(1, "--install_as_accelerate")
    return main(args)


if __name__ == "__main__":
    sys.exit(main())
