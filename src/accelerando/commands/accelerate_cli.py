"""The reference's module path of the command line: ``accelerate_cli.main`` is ``accelerando``'s main."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelerando`` command line (see :func:`accelerando.commands.cli.main`).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status of the subcommand (2 for a usage error).
    """
    from accelerando.commands.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
