"""The reference's import path ``accelerate.utils.launch``.

Re-exports from :mod:`accelerando.launchers.reference`. ``which`` and ``subprocess`` (the machine
look-ups the reference's tests patch here) are the owner's: the module's class reads and writes them
there (:class:`~accelerando.launchers.reference.PatchThroughModule`).
"""

from __future__ import annotations

import sys

from accelerando.launchers.reference import (
    DEEPSPEED_MULTINODE_LAUNCHERS,
    PatchThroughModule,
    PrepareForLaunch,
    env_var_path_add,
    prepare_deepspeed_cmd_env,
    prepare_extend_env_parallelism_config,
    prepare_multi_gpu_env,
    prepare_sagemager_args_inputs,
    prepare_simple_launcher_cmd_env,
    prepare_tpu,
    setup_fp8_env,
)
from accelerando.launchers.reference.sagemaker import convert_nargs_to_dict as _convert_nargs_to_dict  # noqa: F401 (the reference's private name)

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "PrepareForLaunch",
    "env_var_path_add",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "setup_fp8_env",
]

sys.modules[__name__].__class__ = PatchThroughModule
