"""A launch command's ``argparse.Namespace`` (the reference's attribute names) -> resolved settings."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from accelerando.core.settings.fields import FIELDS_BY_NAME
from accelerando.core.settings.resolve import Sourced, resolve

if TYPE_CHECKING:
    from accelerando.core.settings.resolve import Settings

__all__ = ["settings_from_args"]

# Namespace attributes of the reference's launch command whose setting has another name here.
_ATTRIBUTE_ALIASES = {"use_cpu": "cpu"}


def settings_from_args(args: argparse.Namespace, **forced: object) -> Settings:
    """Resolve the settings a launch namespace gives (plus ``forced`` values), checked as the CLI checks them."""
    given = vars(args)
    layer: dict[str, Sourced] = {}
    for attribute, value in given.items():
        name = _ATTRIBUTE_ALIASES.get(attribute, attribute)
        field = FIELDS_BY_NAME.get(name)
        if field is None or value is None:
            continue
        if field.kind == "bool" and value is False and field.switch:
            continue  # an absent switch reads False in a Namespace: "not given"
        if name in layer and not value:
            continue  # `cpu` and `use_cpu` both present: either one true wins
        layer[name] = Sourced(value, f"args.{attribute}")
    for name, value in forced.items():
        layer[name] = Sourced(value, "launcher")
    return resolve([layer], warn_sources=())
