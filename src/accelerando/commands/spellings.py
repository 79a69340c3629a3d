"""Both spellings of every multi-word flag: ``--num_processes`` and ``--num-processes``.

:func:`add_dash_spellings` walks a finished parser (and its subcommands) and registers, for every
``--foo_bar`` option, the lookup ``--foo-bar`` for the same action (and ``--foo_bar`` for a
``--foo-bar`` option). The extra spelling is only a lookup entry, not an option string of the
action, so ``--help`` shows each flag once; the parser's epilog says once that dashes work too.
:class:`SpellingParser` keeps abbreviations working: ``--mix`` prefixes both spellings of one flag,
which plain argparse would call ambiguous.
"""

from __future__ import annotations

import argparse

__all__ = [
    "SPELLING_NOTE",
    "SpellingParser",
    "add_dash_spellings",
    "canonical_key",
    "other_spelling",
]

#: The one line of ``--help`` that tells about the second spelling.
SPELLING_NOTE = "Every --flag_name can also be spelled --flag-name (and the other way round)."


def other_spelling(option: str) -> str | None:
    """The other spelling of a long option: underscores <-> dashes after the leading ``--``.

    Args:
        option: an option string such as ``"--num_processes"``.

    Returns:
        ``"--num-processes"`` for ``"--num_processes"`` and the reverse; ``None`` for a short option, a
        one-word option, or one that mixes both separators.
    """
    if not option.startswith("--"):
        return None
    body = option[2:]
    if "_" in body and "-" not in body:
        return "--" + body.replace("_", "-")
    if "-" in body and "_" not in body:
        return "--" + body.replace("-", "_")
    return None


def canonical_key(option: str) -> str:
    """The spelling-independent form of a long option (dashes after ``--`` become underscores).

    Args:
        option: an option string, possibly with ``=value``.

    Returns:
        ``"--num_processes"`` for ``"--num-processes=2"`` or ``"--num_processes"``; a short option as is.
    """
    name = option.split("=", 1)[0]
    return "--" + name[2:].replace("-", "_") if name.startswith("--") else name


class SpellingParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` where two spellings of one flag are not ambiguous.

    Subparsers made through ``add_subparsers`` are of this class too (argparse uses the parent's).
    """

    def _get_option_tuples(self, option_string: str) -> list[tuple[argparse.Action, str, str | None]]:
        # The tuples are argparse's (Python 3.12 adds a fourth item); only their action is read here.
        # Prefix matching sees both registered spellings of one flag; keep one match per action so an
        # abbreviation stays as valid as it was with one spelling.
        seen: set[int] = set()
        unique: list[tuple[argparse.Action, str, str | None]] = []
        for match in super()._get_option_tuples(option_string):
            if id(match[0]) not in seen:
                seen.add(id(match[0]))
                unique.append(match)
        return unique


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found: dict[int, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.setdefault(id(sub), sub)
    return list(found.values())


def add_dash_spellings(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the other spelling of every multi-word long option of ``parser`` and its subcommands.

    Idempotent. A spelling some other action already uses is left to that action.

    Args:
        parser: a built parser (argument groups included).

    Returns:
        The same parser.
    """
    lookup = parser._option_string_actions
    added = False
    for action in parser._actions:
        for option in action.option_strings:
            other = other_spelling(option)
            if other is not None and other not in lookup:
                lookup[other] = action
                added = True
    if added and SPELLING_NOTE not in (parser.epilog or ""):
        parser.epilog = f"{parser.epilog}\n\n{SPELLING_NOTE}" if parser.epilog else SPELLING_NOTE
    for sub in _subparsers(parser):
        add_dash_spellings(sub)
    return parser
