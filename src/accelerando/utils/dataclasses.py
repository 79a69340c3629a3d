"""The reference's import path for configuration classes and enums: ``accelerando.utils.dataclasses``.

The classes live where they belong (:mod:`accelerando.enums`, :mod:`accelerando.plugins`,
:mod:`accelerando.utils.parallel_configs`); this module re-exports them. The plugins sit in a layer
above ``utils``, so they are imported on first access (PEP 562), which also keeps
``import accelerando.utils.dataclasses`` cheap. Defined here: :class:`EnumWithContains`,
:class:`BaseEnum`, :class:`FP8BackendType` and :func:`get_module_class_from_name`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from accelerando._lazy import lazy_getattr
from accelerando.enums import (
    ComputeEnvironment,
    CustomDtype,
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    LoggerType,
    PrecisionType,
    RNGType,
    SageMakerDistributedType,
)
from accelerando.utils.constants import (
    BETA_CP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
    FSDP2_PYTORCH_VERSION,
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
    MITA_PROFILING_AVAILABLE_PYTORCH_VERSION,
    XPU_PROFILING_AVAILABLE_PYTORCH_VERSION,
)
from accelerando.utils.parallel_configs import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)

if TYPE_CHECKING:
    import torch

_LAZY: dict[str, str] = {
    "KwargsHandler": "accelerando.plugins.kwargs",
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
    "TensorInformation": "accelerando.utils.operations",
    "add_model_config_to_megatron_parser": "accelerando.utils.megatron_parsers",
    "parse_bert_config": "accelerando.utils.megatron_parsers",
    "parse_gpt2_config": "accelerando.utils.megatron_parsers",
    "parse_t5_config": "accelerando.utils.megatron_parsers",
    "parse_llama_config": "accelerando.utils.megatron_parsers",
    "parse_glm4_moe_config": "accelerando.utils.megatron_parsers",
}

__all__ = [
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "FSDP2_PYTORCH_VERSION",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_SHARDING_STRATEGY",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "TYPE_CHECKING",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "BaseEnum",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DeepSpeedSequenceParallelConfig",
    "DistributedType",
    "DynamoBackend",
    "EnumWithContains",
    "FP8BackendType",
    "LoggerType",
    "PrecisionType",
    "RNGType",
    "SageMakerDistributedType",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "get_module_class_from_name",
    *_LAZY,
]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class EnumWithContains(enum.EnumMeta):
    """Enum metaclass whose ``in`` also accepts values: ``"fp16" in PrecisionType`` is True.

    Anything that is neither a member nor a member's value answers False instead of raising.
    """

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except (ValueError, TypeError):
            return False
        return True


class BaseEnum(str, enum.Enum, metaclass=EnumWithContains):
    """Base of string enums: members equal their value, ``str()`` gives it, ``in`` accepts values."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        """Return every value of the enum as a plain string."""
        return [member.value for member in cls]


class FP8BackendType(BaseEnum):
    """The libraries FP8 training can run on (``NO``: no FP8)."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type | None:
    """Find, inside ``module``, a submodule whose class is called ``name`` and return that class.

    FSDP's transformer-based wrapping uses this to turn layer class names from a config
    (``"GPT2Block"``) into classes.

    Args:
        module: the model to search (``module`` itself included).
        name: a class name, without the module path.

    Returns:
        The first matching class in depth-first order, or None when no submodule has that class.
    """
    for submodule in module.modules():
        if type(submodule).__name__ == name:
            return type(submodule)
    return None
