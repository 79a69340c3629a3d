"""What ``accelerando launch --dry-run`` prints: the settings that differ from their defaults, then the plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando.launchers.limits import clip

if TYPE_CHECKING:
    from accelerando.core.settings.resolve import Settings
    from accelerando.launchers.plan import LaunchPlan

__all__ = ["print_dry_run", "print_settings"]


def print_settings(settings: Settings) -> None:
    """Print each setting whose value does not come from its default, with its source.

    A value longer than :data:`~accelerando.launchers.limits.ECHO_LIMIT` characters is cut, with its size.

    Args:
        settings: resolved :class:`~accelerando.core.settings.Settings`.
    """
    print("Settings (value, source) that differ from the defaults:")
    for name, value, source in settings.items():
        if source != "default":
            print(f"  {name} = {clip(repr(value))}  [{source}]")  # a huge value is cut: "... (N bytes)"


def print_dry_run(settings: Settings, plan: LaunchPlan) -> None:
    """Print the non-default settings, then the plan's topology, command and environment.

    Args:
        settings: resolved :class:`~accelerando.core.settings.Settings`.
        plan: the :class:`~accelerando.launchers.plan.LaunchPlan` made from them.
    """
    print_settings(settings)
    print(plan.describe())
