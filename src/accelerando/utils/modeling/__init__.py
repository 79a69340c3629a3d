"""The reference's import path for model sizes, device maps, tensor placement and checkpoint loading:
``accelerando.utils.modeling``.

The code lives in :mod:`accelerando.big_modeling` (``sizes``, ``budgets``, ``tensors``, ``hooks``,
``device_map``, ``allocation``, ``model_info``, ``offloaded_state``, ``offload``, ``loading``) and, for
the grad scaler and autocast helpers, :mod:`accelerando.precision.helpers`; this module re-exports it.
The precision helpers are resolved on first access (the precision package sits above ``utils``).
"""

from __future__ import annotations

from accelerando._lazy import lazy_getattr
from accelerando.big_modeling.allocation import (
    fallback_allocate,
    get_module_leaves,
    get_module_size_with_ties,
)
from accelerando.big_modeling.budgets import (
    convert_file_size_to_int,
    get_balanced_memory,
    get_max_memory,
    normalize_device_key,
)
from accelerando.big_modeling.device_map import check_device_map, clean_device_map, infer_auto_device_map
from accelerando.big_modeling.hooks import align_module_device, has_offloaded_params
from accelerando.big_modeling.loading import checkpoint_files, load_checkpoint_in_model, load_state_dict
from accelerando.big_modeling.model_info import check_tied_parameters_in_config, is_peft_model
from accelerando.big_modeling.offload import load_offloaded_weights
from accelerando.big_modeling.offloaded_state import (
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
)
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
    check_device_same,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    get_module_children_bottom_up,
    get_non_persistent_buffers,
    id_tensor_storage,
    resolve_submodule,
    retie_parameters,
    set_module_tensor_to_device,
    to_torch_device,
)
from accelerando.utils.constants import SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

_LAZY: dict[str, str] = {
    "get_grad_scaler": "accelerando.precision.helpers",
    "get_mixed_precision_context_manager": "accelerando.precision.helpers",
}

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = [
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "checkpoint_files",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_grad_scaler",
    "get_max_layer_size",
    "get_max_memory",
    "get_mixed_precision_context_manager",
    "get_module_children_bottom_up",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "normalize_device_key",
    "parse_dtype",
    "resolve_submodule",
    "retie_parameters",
    "set_module_tensor_to_device",
    "to_torch_device",
]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
