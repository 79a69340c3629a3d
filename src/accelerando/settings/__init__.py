"""Settings resolution: one table of settings, merged from ordered layers with provenance.

``resolve_runtime_settings(code=..., environ=...)`` gives a process its settings
(defaults < environment < code); plugins fill their unset fields with :func:`fill_unset`. The launcher merges defaults < config file < CLI flags with
:func:`resolve` and exports the result to the processes' environment.
"""

from __future__ import annotations

from accelerando.settings.fields import FIELDS, FIELDS_BY_NAME, GROUPS, Field, fields_in_group, get_field
from accelerando.settings.fill import fill_unset
from accelerando.settings.resolve import (
    Layer,
    Settings,
    Sourced,
    code_layer,
    env_layer,
    parse_value,
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
    "fields_in_group",
    "fill_unset",
    "get_field",
    "parse_value",
    "resolve",
    "resolve_runtime_settings",
]
