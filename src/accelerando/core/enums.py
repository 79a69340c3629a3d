"""Enumerations shared across accelerando.

Every enum is a ``str`` subclass so that each member equals the plain string users write in config
files and on the command line: the text ``MULTI_GPU`` in a config file parses to that member.
"""

from __future__ import annotations

import enum

__all__ = [
    "ComputeEnvironment",
    "DDPCommunicationHookType",
    "DistributedType",
    "DynamoBackend",
    "LoggerType",
    "PrecisionType",
    "RNGType",
    "SageMakerDistributedType",
    "CustomDtype",
    "EnumWithContains",
    "BaseEnum",
    "FP8BackendType",
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


class SageMakerDistributedType(_StrEnum):
    """Distribution modes of Amazon SageMaker jobs."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ComputeEnvironment(_StrEnum):
    """Where the run executes."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


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


class LoggerType(_StrEnum):
    """Experiment trackers known by name."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"
    NEPTUNE = "neptune"


class PrecisionType(_StrEnum):
    """Mixed-precision modes."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(_StrEnum):
    """Random number generators that can be synchronised across processes."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    GENERATOR = "generator"
    NUMPY = "numpy"
    PYTHON = "python"


class DDPCommunicationHookType(_StrEnum):
    """Gradient communication hooks for DistributedDataParallel."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class CustomDtype(_StrEnum):
    """Storage types that have no ``torch.dtype`` of their own (used by size computations)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


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
