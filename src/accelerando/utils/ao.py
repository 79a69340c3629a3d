"""The reference's import path ``accelerate.utils.ao``.

Re-exports from :mod:`accelerando.backends.precision.fp8.torchao`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING  # noqa: F401 (a name the reference's module has)

from accelerando.backends.precision.fp8.torchao import (
    convert_model_to_fp8_ao,
    default_module_filter,
    filter_first_and_last_linear_layers,
    filter_linear_layers,
    find_first_last_linear_layers,
    float8_config_for,
    has_ao_layers,
)

__all__ = [
    "convert_model_to_fp8_ao",
    "default_module_filter",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "float8_config_for",
    "has_ao_layers",
]
