"""The reference's import path for CPU/disk offload helpers: ``accelerando.utils.offload``.

They live in :mod:`accelerando.big_modeling.offload`; this module re-exports them.
"""

from __future__ import annotations

from accelerando.big_modeling.offload import (
    SAFETENSORS_DTYPES,
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    load_offloaded_weights,
    offload_state_dict,
    offload_weight,
    read_safetensors_header,
    safetensors_view,
    save_offload_index,
)

__all__ = [
    "SAFETENSORS_DTYPES",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "offload_state_dict",
    "offload_weight",
    "read_safetensors_header",
    "safetensors_view",
    "save_offload_index",
]
