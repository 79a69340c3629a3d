"""The ``accelerando`` command line: one module per subcommand (see :mod:`accelerando.commands.cli`)."""

from __future__ import annotations

__all__: list[str] = []
