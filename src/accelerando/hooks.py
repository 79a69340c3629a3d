"""The reference's import path for the model hooks: ``accelerando.hooks``.

The hooks live in :mod:`accelerando.big_modeling.hooks` and the functions attaching them to a model
in :mod:`accelerando.big_modeling.attach`; this module re-exports them.
"""

from __future__ import annotations

from accelerando.big_modeling.attach import (
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    attach_layerwise_casting_hooks,
    link_prefetch,
)
from accelerando.big_modeling.hooks import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
    send_to_device,
)

# Importable from here before the move (the old module imported them); not part of ``__all__``.
from accelerando.big_modeling.offload import PrefixedDataset  # noqa: F401
from accelerando.big_modeling.sizes import named_module_tensors  # noqa: F401
from accelerando.big_modeling.tensors import set_module_tensor_to_device, to_torch_device  # noqa: F401

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "attach_layerwise_casting_hooks",
    "link_prefetch",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "send_to_device",
]
