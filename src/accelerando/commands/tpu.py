"""``accelerando tpu-config``: accepted for compatibility; TPUs are not supported by accelerando."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "run"]

_MESSAGE = (
    "accelerando tpu-config: TPU pods are not supported by accelerando, so there is nothing to configure. "
    "Fix: train on CPUs or GPUs with `accelerando launch`, or use a TPU-specific launcher."
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``accelerando tpu-config`` (it accepts the reference's flags and explains).

    Args:
        subparsers: the object returned by ``ArgumentParser.add_subparsers()``.

    Returns:
        The new subparser.
    """
    parser = subparsers.add_parser("tpu-config", help="Not supported: TPUs are not handled by accelerando.")
    parser.set_defaults(func=run, accepts_unknown=True)
    return parser


def run(args: argparse.Namespace) -> int:
    """Explain that TPUs are not supported.

    Args:
        args: the parsed arguments (ignored).

    Returns:
        1, always.
    """
    del args
    print(_MESSAGE, file=sys.stderr)
    return 1
