"""FSDP helpers at the reference's ``accelerate.utils.fsdp_utils`` path (re-exports only).

They are defined in :mod:`accelerando.backends.strategies.fsdp.checkpoint` (and, for sharding and merging, in
:mod:`accelerando.backends.strategies.fsdp`); the checkpoint file names come from
:mod:`accelerando.common.constants`.
"""

from __future__ import annotations

from accelerando.backends.strategies.fsdp.checkpoint import (
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
    ensure_weights_retied,
    fsdp2_apply_ac,
    fsdp2_canonicalize_names,
    fsdp2_load_full_state_dict,
    fsdp2_prepare_auto_wrap_policy,
    fsdp2_prepare_model,
    fsdp2_switch_optimizer_parameters,
    get_fsdp2_grad_scaler,
    get_parameters_from_modules,
    load_fsdp_model,
    load_fsdp_optimizer,
    merge_fsdp_weights,
    save_fsdp_model,
    save_fsdp_optimizer,
)

# Names the reference's module imports and test suites patch there (``...fsdp_utils.logger``,
# ``...fsdp_utils.is_compiled_module``): the owners' objects (not in __all__, as in the reference).
from accelerando.backends.strategies.fsdp.helpers import logger  # noqa: F401
from accelerando.big_modeling.tensors import get_non_persistent_buffers  # noqa: F401
from accelerando.common.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from accelerando.common.other import get_module_class_from_name  # noqa: F401
from accelerando.common.unwrap import is_compiled_module  # noqa: F401

__all__ = [
    "FSDP_MODEL_NAME",
    "OPTIMIZER_NAME",
    "SAFE_WEIGHTS_NAME",
    "WEIGHTS_NAME",
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]
