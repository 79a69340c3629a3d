"""The one helper plugins use to fill their unset fields from the resolved settings.

A plugin dataclass (FSDP, DeepSpeed, dynamo, ...) leaves every field the user did not pass as
``None``; :func:`fill_unset` then copies the value the launcher or the environment set for the
matching setting, so the user's explicit argument always wins and nothing is read from
``os.environ`` outside this package.
"""

from __future__ import annotations

from collections.abc import Mapping

from accelerando.core.settings.fields import fields_in_group
from accelerando.core.settings.resolve import Settings, process_settings

__all__ = ["fill_unset"]


def fill_unset(
    obj: object,
    group: str,
    *,
    prefix: str = "",
    rename: Mapping[str, str] | None = None,
    settings: Settings | None = None,
    include_defaults: bool = False,
) -> dict[str, str]:
    """Set each ``None`` attribute of ``obj`` from the resolved setting of the same name.

    The attribute for a setting is ``rename[setting]`` if given, else the setting name without
    ``prefix`` (``fsdp_sharding_strategy`` -> ``sharding_strategy`` with ``prefix="fsdp_"``).
    Attributes that are not ``None`` (given in code) or do not exist are left alone.

    Args:
        obj: the plugin instance to fill (any object with attributes).
        group: settings group to read (``"fsdp"``, ``"deepspeed"``, ``"dynamo"``, ``"megatron"``).
        prefix: prefix removed from setting names to get attribute names.
        rename: setting name -> attribute name, for attributes named differently.
        settings: resolved settings to read; ``None`` reads the process's (:func:`process_settings`).
        include_defaults: also copy values that no layer set (the table's defaults).

    Returns:
        attribute name -> source label (``"env:FSDP_SHARDING_STRATEGY"``, ...) of every attribute set.

    Raises:
        ValueError: for an unknown group, or an invalid value in the environment.

    Example:
        >>> class Plugin:
        ...     sharding_strategy = None
        >>> from accelerando.core.settings import resolve_runtime_settings
        >>> s = resolve_runtime_settings(environ={"FSDP_SHARDING_STRATEGY": "NO_SHARD"})
        >>> p = Plugin(); fill_unset(p, "fsdp", prefix="fsdp_", settings=s)
        {'sharding_strategy': 'env:FSDP_SHARDING_STRATEGY'}
        >>> p.sharding_strategy
        'NO_SHARD'
    """
    resolved = settings if settings is not None else process_settings()
    renames = dict(rename or {})
    filled: dict[str, str] = {}
    for field in fields_in_group(group):
        source = resolved.source(field.name)
        if source == "default" and not include_defaults:
            continue
        attribute = renames.get(field.name) or field.name.removeprefix(prefix)
        if not hasattr(obj, attribute) or getattr(obj, attribute) is not None:
            continue
        value = resolved[field.name]
        setattr(obj, attribute, list(value) if isinstance(value, tuple) else value)
        filled[attribute] = source
    return filled
