"""The ``accelerando`` console script.

Each subcommand lives in its own module of :mod:`accelerando.commands` exposing
``add_parser(subparsers)`` (which registers the command and calls ``set_defaults(func=run)``) and
``run(args) -> int``. A module that does not exist (yet) is skipped. When the first argument names a
subcommand only that module is imported, which keeps ``accelerando launch`` fast; ``accelerando``,
``accelerando --help`` and an unknown command import no subcommand module at all (the listing comes
from :data:`HELP`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from accelerando.commands.spellings import SPELLING_NOTE, SpellingParser, add_dash_spellings

__all__ = ["HELP", "SUBCOMMANDS", "build_parser", "main"]

#: command name -> module under accelerando.commands.
SUBCOMMANDS: dict[str, str] = {
    "config": "config",
    "env": "env",
    "launch": "launch",
    "test": "test",
    "estimate-memory": "estimate",
    "plan": "plan",
    "merge-weights": "merge",
    "tpu-config": "tpu",
    "to-fsdp2": "to_fsdp2",
}
#: command name -> the one line ``accelerando --help`` shows for it.
HELP: dict[str, str] = {
    "config": "Create (questions, or `default`) or update a config file.",
    "env": "Print versions, hardware and the settings in effect.",
    "launch": "Launch a script.",
    "test": "Check that training works with the current configuration.",
    "estimate-memory": "Estimate the memory a model needs to load and to train.",
    "plan": "Simulate a training step per parallel layout on a cluster and rank those that fit.",
    "merge-weights": "Merge a sharded FSDP checkpoint into full weights.",
    "tpu-config": "Run setup commands on every worker of a Cloud TPU pod (gcloud).",
    "to-fsdp2": "Convert a config file's FSDP1 options to FSDP2.",
}


def _load(module: str) -> ModuleType | None:
    name = f"accelerando.commands.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name == name:  # not written yet: skip it; a missing dependency inside it still raises
            return None
        raise


def build_parser(only: str | None = None, listing_only: bool = False) -> argparse.ArgumentParser:
    """Build the ``accelerando`` parser with every available subcommand.

    Every multi-word flag of every subcommand takes both spellings (``--config_file``, ``--config-file``).

    Args:
        only: register just this command (used when the command line names it).
        listing_only: register every command by name and help line only, importing no subcommand
            module (enough for ``accelerando --help`` and for reporting an unknown command).

    Returns:
        The parser.
    """
    parser = SpellingParser(
        "accelerando",
        description="Launch and configure PyTorch training on any hardware.",
        epilog=SPELLING_NOTE,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    if listing_only:
        for name in SUBCOMMANDS:
            subparsers.add_parser(name, help=HELP.get(name), add_help=False)
        return parser
    modules = [SUBCOMMANDS[only]] if only in SUBCOMMANDS else list(dict.fromkeys(SUBCOMMANDS.values()))
    for module_name in modules:
        module = _load(module_name)
        if module is not None and hasattr(module, "add_parser"):
            module.add_parser(subparsers)
    return add_dash_spellings(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelerando`` command line.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status of the subcommand (2 for a usage error).
    """
    as_program = argv is None  # the console script: a one-process launch may become the script
    argv = list(sys.argv[1:] if argv is None else argv)
    first = argv[0] if argv else None
    if first == "launch":
        # Launch splits its own flags from the script's before argparse sees them.
        from accelerando.commands import launch

        return launch.main(argv[1:], replace_process=as_program)
    parser = build_parser(first, listing_only=first not in SUBCOMMANDS)
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_unknown", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0 if not argv else 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
