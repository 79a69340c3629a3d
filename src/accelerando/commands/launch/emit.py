"""``accelerando launch --emit``: write the job for a cluster scheduler instead of launching it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import accelerando.launchers as launchers
from accelerando.commands.launch.resolution import command_of, resolve_launch_settings

if TYPE_CHECKING:
    import accelerando.launchers.emit  # noqa: F401 - names the submodule for type checkers

# The job writers (launchers.emit: 5 accelerando modules, dataclasses and regexes built at import) are
# reached through the package's lazy attribute on first use, so a launch without --emit never loads them.

__all__ = ["emit"]


def emit(args: argparse.Namespace) -> int | None:
    """With ``--emit``, write the job for a scheduler instead of launching; ``None`` without it.

    The job goes to ``--emit_to`` (its path is then printed unless ``--quiet``) or to stdout.

    Args:
        args: the parsed launch arguments.

    Returns:
        0 once the job is written; ``None`` when ``--emit`` is not set (launch as usual).

    Raises:
        ValueError: impossible settings, or a file that cannot be written (the message says why).
    """
    settings, _notes = resolve_launch_settings(args)
    if not settings.emit:
        return None

    text = launchers.emit.emit_job(settings, command_of(args))
    try:
        shown = launchers.emit.write_job(text, settings.emit_to)
    except OSError as err:
        raise ValueError(
            f"cannot write the job to {settings.emit_to!r} (--emit_to): {err.strerror}. Fix: give a writable path."
        ) from None
    if settings.emit_to:
        if not args.quiet:
            print(f"accelerando launch: {shown}", file=sys.stderr)
    else:
        sys.stdout.write(shown)
    return 0
