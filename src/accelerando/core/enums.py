"""Enumerations shared across accelerando.

Every enum is a ``str`` subclass so that each member equals the plain string users write in config
files and on the command line: the text ``MULTI_GPU`` in a config file parses to that member. The
enums a first Accelerator does not use live in :mod:`accelerando.core.enums_on_demand` and are handed
out from here on first use.
"""

from __future__ import annotations

import enum

from accelerando.core._lazy import lazy_getattr

__all__ = [
    "DistributedType",
    "DynamoBackend",
    "PrecisionType",
    "EnumWithContains",
    "BaseEnum",
    "FP8BackendType",
    "ON_DEMAND_ENUMS",
]


class _StrEnum(str, enum.Enum):
    """A string enum whose ``str()`` is its value and which lists its values."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        """Return every value of the enum as a plain string."""
        return [member.value for member in cls]


class DistributedType(_StrEnum):
    """How the processes of a run cooperate (what ``Accelerator.distributed_type`` reports)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class DynamoBackend(_StrEnum):
    """Backends accepted by ``torch.compile`` (``NO`` disables compilation)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class PrecisionType(_StrEnum):
    """Mixed-precision modes."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


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


#: Defined in enums_on_demand.py and created the first time one is read from here: a first Accelerator
#: uses none of them, and an Enum class costs about a quarter of a millisecond to build.
ON_DEMAND_ENUMS = (
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "LoggerType",
    "RNGType",
    "SageMakerDistributedType",
)

__getattr__ = lazy_getattr(
    __name__, dict.fromkeys(ON_DEMAND_ENUMS, "accelerando.core.enums_on_demand"), globals()
)
