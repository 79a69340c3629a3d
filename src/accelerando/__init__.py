"""accelerando: run one PyTorch script unchanged on CPU, one GPU, many GPUs and many machines.

Public names are resolved lazily (PEP 562), so ``import accelerando`` costs almost nothing beyond
``import torch``; each name's module is imported the first time the name is used. Subpackages are
attributes too (``accelerando.utils.set_seed``), imported on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando.core._lazy import lazy_getattr
from accelerando.core.version import __version__

_EXPORTS: dict[str, str] = {
    "Accelerator": "accelerando.accelerator",
    "PartialState": "accelerando.state",
    "ParallelismConfig": "accelerando.parallelism_config",
    "init_empty_weights": "accelerando.big_modeling.empty_init",
    "init_on_device": "accelerando.big_modeling.empty_init",
    "cpu_offload": "accelerando.big_modeling.dispatch",
    "cpu_offload_with_hook": "accelerando.big_modeling.dispatch",
    "disk_offload": "accelerando.big_modeling.dispatch",
    "dispatch_model": "accelerando.big_modeling.dispatch",
    "load_checkpoint_and_dispatch": "accelerando.big_modeling.loading",
    "skip_first_batches": "accelerando.data_loader",
    "prepare_pippy": "accelerando.inference",
    "notebook_launcher": "accelerando.launchers",
    "debug_launcher": "accelerando.launchers",
    "find_executable_batch_size": "accelerando.backends.monitoring.oom",
    "infer_auto_device_map": "accelerando.big_modeling.device_map",
    "load_checkpoint_in_model": "accelerando.big_modeling.loading",
    "compute_module_sizes": "accelerando.big_modeling.sizes",
    "get_balanced_memory": "accelerando.big_modeling.budgets",
    "find_tied_parameters": "accelerando.big_modeling.tensors",
    "check_tied_parameters_on_same_device": "accelerando.big_modeling.tensors",
    "retie_parameters": "accelerando.big_modeling.tensors",
    "synchronize_rng_states": "accelerando.common.random",
    "set_seed": "accelerando.common.random",
    "AutocastKwargs": "accelerando.plugins.kwargs",
    "DistributedDataParallelKwargs": "accelerando.plugins.kwargs",
    "GradScalerKwargs": "accelerando.plugins.kwargs",
    "InitProcessGroupKwargs": "accelerando.plugins.kwargs",
    "ProfileKwargs": "accelerando.plugins.kwargs",
    "DataLoaderConfiguration": "accelerando.plugins.dataloader",
    "DeepSpeedPlugin": "accelerando.plugins.deepspeed",
    "FullyShardedDataParallelPlugin": "accelerando.plugins.fsdp",
    "DDPCommunicationHookType": "accelerando.core.enums_on_demand",
    "DistributedType": "accelerando.core.enums",
    "save_accelerator_state": "accelerando.checkpointing",
    "load_accelerator_state": "accelerando.checkpointing",
    "save_custom_state": "accelerando.checkpointing",
    "load_custom_state": "accelerando.checkpointing",
    "is_cuda_available": "accelerando.common.imports",
    "is_deepspeed_available": "accelerando.common.imports",
    "write_basic_config": "accelerando.commands.config",
    "convert_bytes": "accelerando.common.names",
    "PipelineParallelPlugin": "accelerando.plugins.pipeline",
    "FaultTolerancePlugin": "accelerando.plugins.fault_tolerance",
    "is_rich_available": "accelerando.common.imports",
    "install_as_accelerate": "accelerando.core.stand_in",
}

__all__ = ["__version__", *_EXPORTS]

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals(), submodules=True)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - static analysers only
    from accelerando.accelerator import Accelerator  # noqa: F401
    from accelerando.state import PartialState  # noqa: F401
