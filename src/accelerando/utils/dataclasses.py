"""The reference's import path ``accelerate.utils.dataclasses``: configuration classes and enums.

Each name is read from its owner on first access (PEP 562), so importing this module stays cheap.
"""

from __future__ import annotations

from accelerando.core._lazy import lazy_dir, lazy_getattr

_EXPORTS: dict[str, str] = {
    "ComputeEnvironment": "accelerando.core.enums_on_demand",
    "CustomDtype": "accelerando.core.enums_on_demand",
    "DDPCommunicationHookType": "accelerando.core.enums_on_demand",
    "DistributedType": "accelerando.core.enums",
    "DynamoBackend": "accelerando.core.enums",
    "LoggerType": "accelerando.core.enums_on_demand",
    "PrecisionType": "accelerando.core.enums",
    "RNGType": "accelerando.core.enums_on_demand",
    "SageMakerDistributedType": "accelerando.core.enums_on_demand",
    "EnumWithContains": "accelerando.core.enums",
    "BaseEnum": "accelerando.core.enums",
    "FP8BackendType": "accelerando.core.enums",
    "BETA_CP_AVAILABLE_PYTORCH_VERSION": "accelerando.common.constants",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION": "accelerando.common.constants",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION": "accelerando.common.constants",
    "FSDP2_PYTORCH_VERSION": "accelerando.common.constants",
    "FSDP_AUTO_WRAP_POLICY": "accelerando.common.constants",
    "FSDP_BACKWARD_PREFETCH": "accelerando.common.constants",
    "FSDP_SHARDING_STRATEGY": "accelerando.common.constants",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION": "accelerando.common.constants",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION": "accelerando.common.constants",
    "DeepSpeedSequenceParallelConfig": "accelerando.plugins.parallel_configs",
    "TorchContextParallelConfig": "accelerando.plugins.parallel_configs",
    "TorchTensorParallelConfig": "accelerando.plugins.parallel_configs",
    "get_module_class_from_name": "accelerando.common.other",
    "TYPE_CHECKING": "typing",
    "KwargsHandler": "accelerando.plugins.kwargs_handler",
    "AutocastKwargs": "accelerando.plugins.kwargs",
    "DistributedDataParallelKwargs": "accelerando.plugins.kwargs",
    "GradScalerKwargs": "accelerando.plugins.kwargs",
    "InitProcessGroupKwargs": "accelerando.plugins.kwargs",
    "ProfileKwargs": "accelerando.plugins.kwargs",
    "FP8RecipeKwargs": "accelerando.plugins.kwargs",
    "TERecipeKwargs": "accelerando.plugins.kwargs",
    "AORecipeKwargs": "accelerando.plugins.kwargs",
    "MSAMPRecipeKwargs": "accelerando.plugins.kwargs",
    "BnbQuantizationConfig": "accelerando.plugins.bnb",
    "DataLoaderConfiguration": "accelerando.plugins.dataloader",
    "DeepSpeedPlugin": "accelerando.plugins.deepspeed",
    "FullyShardedDataParallelPlugin": "accelerando.plugins.fsdp",
    "GradientAccumulationPlugin": "accelerando.plugins.accumulation",
    "MegatronLMPlugin": "accelerando.plugins.megatron",
    "ProjectConfiguration": "accelerando.plugins.project",
    "TorchDynamoPlugin": "accelerando.plugins.dynamo",
    "TorchTensorParallelPlugin": "accelerando.plugins.tensor_parallel",
    "TensorInformation": "accelerando.common.operations",
    "add_model_config_to_megatron_parser": "accelerando.plugins.megatron_parsers",
    "parse_bert_config": "accelerando.plugins.megatron_parsers",
    "parse_gpt2_config": "accelerando.plugins.megatron_parsers",
    "parse_t5_config": "accelerando.plugins.megatron_parsers",
    "parse_llama_config": "accelerando.plugins.megatron_parsers",
    "parse_glm4_moe_config": "accelerando.plugins.megatron_parsers",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
__dir__ = lazy_dir(__all__)
