"""Settings resolution: one table of settings, merged from ordered layers with provenance.

``process_settings()`` is what the environment gives the process, resolved once (again only when a
variable changes); ``resolve_runtime_settings(code=...)`` adds the arguments given in code on top
(defaults < environment < code); plugins fill their unset fields with :func:`fill_unset`. The launcher
merges defaults < config file < CLI flags with :func:`resolve` and exports the result to the
processes' environment.
"""

from __future__ import annotations

from accelerando.core.settings.fields import FIELDS, FIELDS_BY_NAME, GROUPS, Field, fields_in_group, get_field
from accelerando.core.settings.fill import fill_unset
from accelerando.core.settings.resolve import (
    Layer,
    Settings,
    Sourced,
    code_layer,
    env_layer,
    environment_hidden,
    environment_setting,
    environment_text,
    environment_value,
    forget_process_settings,
    parse_value,
    process_settings,
    resolve,
    resolve_runtime_settings,
)

__all__ = [
    "FIELDS",
    "FIELDS_BY_NAME",
    "GROUPS",
    "Field",
    "Layer",
    "Settings",
    "Sourced",
    "code_layer",
    "env_layer",
    "environment_hidden",
    "environment_setting",
    "environment_text",
    "environment_value",
    "fields_in_group",
    "fill_unset",
    "forget_process_settings",
    "get_field",
    "parse_value",
    "process_settings",
    "resolve",
    "resolve_runtime_settings",
]
