"""The reference's import path ``accelerate.utils.other``.

Re-exports from the owners: :mod:`accelerando.common.other` (facts about prepared models),
:mod:`accelerando.common.compilation` (regional compilation), :mod:`accelerando.common.ports`,
:mod:`accelerando.common.names` (names and sizes), :mod:`accelerando.big_modeling.tensors`, and the
names the reference's module imports from elsewhere (``save``, ``load``, ``wait_for_everyone``...).
"""

from __future__ import annotations

from accelerando.big_modeling.tensors import get_module_children_bottom_up
from accelerando.common.compilation import (
    compile_regions,
    compile_regions_deepspeed,
    compile_regions_fsdp2,
    has_compiled_regions,
    has_repeated_blocks,
    is_repeated_blocks,
)
from accelerando.common.constants import FSDP_PYTORCH_VERSION
from accelerando.common.environment import check_os_kernel
from accelerando.common.names import convert_bytes, get_pretty_name, merge_dicts, recursive_getattr
from accelerando.common.operations import wait_for_everyone
from accelerando.common.other import (
    TORCH_SAFE_GLOBALS,
    extract_model_from_parallel,
    get_model_tp_size,
    get_module_class_from_name,
    model_has_dtensor,
)
from accelerando.common.ports import get_free_port, is_port_in_use
from accelerando.common.serialization import clean_state_dict_for_safetensors, load, save
from accelerando.common.unwrap import is_compiled_module

__all__ = [
    "FSDP_PYTORCH_VERSION",
    "TORCH_SAFE_GLOBALS",
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_free_port",
    "get_model_tp_size",
    "get_module_children_bottom_up",
    "get_module_class_from_name",
    "get_pretty_name",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_compiled_module",
    "is_port_in_use",
    "is_repeated_blocks",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
]
