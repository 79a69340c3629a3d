"""The reference's import path ``accelerate.utils.modeling``: model sizes, device maps, tensor placement
and checkpoint loading.

The code lives in :mod:`accelerando.big_modeling` and, for the grad scaler and autocast helpers,
:mod:`accelerando.backends.precision.helpers`; each name is read from its owner on first access (PEP 562).
"""

from __future__ import annotations

from accelerando.core._lazy import lazy_dir, lazy_getattr

_EXPORTS: dict[str, str] = {
    "_get_proper_dtype": "accelerando.big_modeling.sizes",
    "SAFE_WEIGHTS_NAME": "accelerando.common.constants",
    "WEIGHTS_INDEX_NAME": "accelerando.common.constants",
    "WEIGHTS_NAME": "accelerando.common.constants",
    "align_module_device": "accelerando.big_modeling.hooks",
    "calculate_maximum_sizes": "accelerando.big_modeling.sizes",
    "check_device_map": "accelerando.big_modeling.device_map",
    "check_device_same": "accelerando.big_modeling.tensors",
    "check_tied_parameters_in_config": "accelerando.big_modeling.model_info",
    "check_tied_parameters_on_same_device": "accelerando.big_modeling.tensors",
    "checkpoint_files": "accelerando.big_modeling.loading",
    "clean_device_map": "accelerando.big_modeling.device_map",
    "compute_module_sizes": "accelerando.big_modeling.sizes",
    "compute_module_total_buffer_size": "accelerando.big_modeling.sizes",
    "convert_file_size_to_int": "accelerando.big_modeling.budgets",
    "dtype_byte_size": "accelerando.big_modeling.sizes",
    "fallback_allocate": "accelerando.big_modeling.allocation",
    "find_tied_parameters": "accelerando.big_modeling.tensors",
    "get_balanced_memory": "accelerando.big_modeling.budgets",
    "get_grad_scaler": "accelerando.backends.precision.helpers",
    "get_max_layer_size": "accelerando.big_modeling.sizes",
    "get_max_memory": "accelerando.big_modeling.budgets",
    "get_mixed_precision_context_manager": "accelerando.backends.precision.helpers",
    "get_module_children_bottom_up": "accelerando.big_modeling.tensors",
    "get_module_leaves": "accelerando.big_modeling.allocation",
    "get_module_size_with_ties": "accelerando.big_modeling.allocation",
    "get_non_persistent_buffers": "accelerando.big_modeling.tensors",
    "get_state_dict_from_offload": "accelerando.big_modeling.offloaded_state",
    "get_state_dict_offloaded_model": "accelerando.big_modeling.offloaded_state",
    "has_offloaded_params": "accelerando.big_modeling.hooks",
    "id_tensor_storage": "accelerando.big_modeling.tensors",
    "infer_auto_device_map": "accelerando.big_modeling.device_map",
    "is_peft_model": "accelerando.big_modeling.model_info",
    "load_checkpoint_in_model": "accelerando.big_modeling.loading",
    "load_offloaded_weights": "accelerando.big_modeling.offload",
    "load_state_dict": "accelerando.big_modeling.loading",
    "named_module_tensors": "accelerando.big_modeling.sizes",
    "normalize_device_key": "accelerando.big_modeling.budgets",
    "parse_dtype": "accelerando.big_modeling.sizes",
    "resolve_submodule": "accelerando.big_modeling.tensors",
    "retie_parameters": "accelerando.big_modeling.tensors",
    "set_module_tensor_to_device": "accelerando.big_modeling.tensors",
    "to_torch_device": "accelerando.big_modeling.tensors",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
__dir__ = lazy_dir(__all__)
