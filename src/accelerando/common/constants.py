"""File names, version floors and option lists shared across accelerando.

This module is the single home of these values (the reference's ``accelerate.utils.constants``); other
modules import them from here. It imports nothing beyond the standard library, so reading a constant
costs nothing.

The distributed-type lists hold plain strings. Every ``DistributedType`` member is a ``str`` equal to
its value, so ``state.distributed_type in CUDA_DISTRIBUTED_TYPES`` works for members and for plain
strings alike, and the lists can name types (``TP``, ``MULTI_NEURON``) without importing the enum.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # built on first read by ``__getattr__`` below
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING: tuple[type, ...]

__all__ = [
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "CUDA_DISTRIBUTED_TYPES",
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DTENSOR_PYTORCH_VERSION",
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
    "FSDP2_PYTORCH_VERSION",
    "FSDP2_STATE_DICT_TYPE",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_MODEL_NAME",
    "FSDP_PYTORCH_VERSION",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_STATE_DICT_TYPE",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAGEMAKER_PARALLEL_EC2_INSTANCES",
    "SAGEMAKER_PYTHON_VERSION",
    "SAGEMAKER_PYTORCH_VERSION",
    "SAGEMAKER_TRANSFORMERS_VERSION",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "STR_OPERATION_TO_FUNC",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "TORCH_DYNAMO_MODES",
    "TORCH_LAUNCH_PARAMS",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
]

# --- checkpoint and weight file names -------------------------------------------------------------
SCALER_NAME = "scaler.pt"
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
RNG_STATE_NAME = "random_states"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
FSDP_MODEL_NAME = "pytorch_model_fsdp"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"

# --- Amazon SageMaker ---------------------------------------------------------------------------
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]

# --- FSDP option values (the names config files and flags accept) ----------------------------------
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]

# --- minimum library versions of features ---------------------------------------------------------
# The FSDP floor is a pre-release build string on purpose: it admits the 2.1 nightlies that shipped it.
FSDP_PYTORCH_VERSION = "2.1.0.a0+32f93b1"
FSDP2_PYTORCH_VERSION = "2.6.0"
DTENSOR_PYTORCH_VERSION = "2.5.0"
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"

# --- launcher choices -------------------------------------------------------------------------------
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
# The options of ``torchrun`` (``torch.distributed.run``) that a launch passes through to it.
TORCH_LAUNCH_PARAMS = [
    "nnodes",
    "nproc_per_node",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "standalone",
    "max_restarts",
    "monitor_interval",
    "start_method",
    "role",
    "module",
    "m",
    "no_python",
    "run_path",
    "log_dir",
    "r",
    "redirects",
    "t",
    "tee",
    "node_rank",
    "master_addr",
    "master_port",
]
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]

# --- distributed types ----------------------------------------------------------------------------
# Types whose processes run on CUDA devices (with NCCL between them).
CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
# Types whose processes talk through torch.distributed (every multi-process type except XLA).
TORCH_DISTRIBUTED_OPERATION_TYPES = [
    *CUDA_DISTRIBUTED_TYPES,
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_CPU",
    "MULTI_HPU",
    "MULTI_NEURON",
]

# --- version comparisons ----------------------------------------------------------------------------
# The operator strings ``compare_versions`` / ``is_torch_version`` accept, and what each one does.
STR_OPERATION_TO_FUNC = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


# --- torch layer classes (built on first read, so reading the other constants never imports torch) --
def _supported_layers_for_upcasting() -> tuple[type, ...]:
    from torch import nn

    return (
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        nn.ConvTranspose1d,
        nn.ConvTranspose2d,
        nn.ConvTranspose3d,
        nn.Linear,
    )


_LAZY = {"SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING": _supported_layers_for_upcasting}


def __getattr__(name: str) -> tuple[type, ...]:
    """Build the constants that need torch on first read (PEP 562).

    ``SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING``: the layer classes whose weights
    :func:`~accelerando.big_modeling.attach_layerwise_casting_hooks` stores in a low-precision dtype.

    Raises:
        AttributeError: for any other missing name.
    """
    build = _LAZY.get(name)
    if build is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = build()
    globals()[name] = value
    return value
