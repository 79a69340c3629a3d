"""The string enums no first Accelerator needs (trackers, RNG kinds, DDP hooks, SageMaker, dtypes).

Read them from :mod:`accelerando.core.enums`, which hands them out from here on first use.
"""

from __future__ import annotations

from accelerando.core.enums import ON_DEMAND_ENUMS, _StrEnum  # pyright: ignore[reportPrivateUsage]

__all__ = list(ON_DEMAND_ENUMS)


class SageMakerDistributedType(_StrEnum):
    """Distribution modes of Amazon SageMaker jobs."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ComputeEnvironment(_StrEnum):
    """Where the run executes."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


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
