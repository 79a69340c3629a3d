"""The reference's import path for model sizes, device maps, tensor placement and checkpoint loading:
``accelerando.utils.modeling``.

The code lives in :mod:`accelerando.big_modeling` (``sizes``, ``budgets``, ``tensors``, ``hooks``,
``device_map``, ``loading``); this module re-exports it.
"""

from __future__ import annotations

from accelerando.big_modeling.budgets import (
    convert_file_size_to_int,
    get_balanced_memory,
    get_max_memory,
    normalize_device_key,
)
from accelerando.big_modeling.device_map import clean_device_map, infer_auto_device_map
from accelerando.big_modeling.hooks import align_module_device, has_offloaded_params
from accelerando.big_modeling.loading import checkpoint_files, load_checkpoint_in_model, load_state_dict
from accelerando.big_modeling.sizes import (
    calculate_maximum_sizes,
    compute_module_sizes,
    compute_module_total_buffer_size,
    dtype_byte_size,
    get_max_layer_size,
    named_module_tensors,
    parse_dtype,
)
from accelerando.big_modeling.tensors import (
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    get_module_children_bottom_up,
    resolve_submodule,
    retie_parameters,
    set_module_tensor_to_device,
    to_torch_device,
)

__all__ = [
    "align_module_device",
    "calculate_maximum_sizes",
    "check_tied_parameters_on_same_device",
    "checkpoint_files",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_children_bottom_up",
    "has_offloaded_params",
    "infer_auto_device_map",
    "load_checkpoint_in_model",
    "load_state_dict",
    "named_module_tensors",
    "normalize_device_key",
    "parse_dtype",
    "resolve_submodule",
    "retie_parameters",
    "set_module_tensor_to_device",
    "to_torch_device",
]
