"""Argument parser classes where every multi-word flag takes both spellings as it is added.

:class:`CustomArgumentParser` and :class:`CustomArgumentGroup` register ``--foo-bar`` as a second
lookup for each ``--foo_bar`` option (and the reverse) the moment the option is added, so a parser
built piece by piece never needs a final :func:`~accelerando.commands.spellings.add_dash_spellings`
pass. ``--help`` keeps showing the spelling the option was declared with.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, TypedDict

from accelerando.commands.spellings import SPELLING_NOTE, SpellingParser, other_spelling

if TYPE_CHECKING:
    from typing_extensions import Unpack


class GroupOptions(TypedDict, total=False):
    """The keyword-only options of ``argparse``'s argument groups."""

    prefix_chars: str
    argument_default: object
    conflict_handler: str


__all__ = ["CustomArgumentGroup", "CustomArgumentParser"]


def _register_other_spellings(container: argparse._ActionsContainer, action: argparse.Action) -> None:
    """Make each long option of ``action`` reachable with its other spelling (lookup only)."""
    lookup = container._option_string_actions
    for option in action.option_strings:
        other = other_spelling(option)
        if other is not None and other not in lookup:
            lookup[other] = action


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose multi-word options also answer to their other spelling.

    Created by :meth:`CustomArgumentParser.add_argument_group`; shares its parser's option table.
    """

    def __init__(
        self,
        container: argparse._ActionsContainer,
        title: str | None = None,
        description: str | None = None,
        **kwargs: Unpack[GroupOptions],
    ) -> None:
        super().__init__(container, title=title, description=description, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add an argument like :meth:`argparse.ArgumentParser.add_argument`, plus the other spelling.

        Returns:
            The new action.

        Raises:
            argparse.ArgumentError: when an option string is already taken (as argparse does).
        """
        action = super().add_argument(*args, **kwargs)
        _register_other_spellings(self, action)
        return action


class CustomArgumentParser(SpellingParser):
    """An argument parser whose multi-word options also answer to their other spelling.

    ``--num_processes`` and ``--num-processes`` reach the same option; an abbreviation that prefixes
    both spellings of one option is not ambiguous; ``--help`` lists one spelling and says once that
    the other works too.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if SPELLING_NOTE not in (self.epilog or ""):
            self.epilog = f"{self.epilog}\n\n{SPELLING_NOTE}" if self.epilog else SPELLING_NOTE

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add an argument like :meth:`argparse.ArgumentParser.add_argument`, plus the other spelling.

        Returns:
            The new action.

        Raises:
            argparse.ArgumentError: when an option string is already taken (as argparse does).
        """
        action = super().add_argument(*args, **kwargs)
        _register_other_spellings(self, action)
        return action

    def add_argument_group(
        self, title: str | None = None, description: str | None = None, **kwargs: Unpack[GroupOptions]
    ) -> CustomArgumentGroup:
        """Add a :class:`CustomArgumentGroup` (same arguments as argparse's ``add_argument_group``).

        Returns:
            The new group.
        """
        group = CustomArgumentGroup(self, title, description, **kwargs)
        self._action_groups.append(group)
        return group
