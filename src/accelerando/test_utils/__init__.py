"""Helpers for testing accelerando and projects built on it (the reference's ``test_utils``).

- ``testing``: skip decorators by hardware and installed library, ``slow``/``skip``, ``torch_device``,
  ``get_launch_command`` + ``execute_subprocess_async`` to launch scripts, test-case bases, assertions.
- ``training``: ``RegressionModel`` / ``RegressionDataset`` (a tiny linear model and matching data) and
  MRPC dataloaders built from CSV samples.
- ``examples``: checks that complete example scripts contain their by-feature additions.
- ``scripts``: standalone check scripts to run under ``accelerando launch`` (``path_in_accelerate_package``
  locates them).
- ``distributed``: ``run_distributed`` (a function in N real processes) and ``launch_script``.

Importing this package loads nothing until a name is used (no pytest, no transformers).
"""

from __future__ import annotations

import importlib
from typing import Any

from accelerando.core._lazy import lazy_getattr

_TESTING = "accelerando.test_utils.testing"
_TRAINING = "accelerando.test_utils.training"
_DISTRIBUTED = "accelerando.test_utils.distributed"

_EXPORTS = {
    "DEFAULT_LAUNCH_COMMAND": _TESTING,
    "AccelerateTestCase": _TESTING,
    "MockingTestCase": _TESTING,
    "SubprocessCallException": _TESTING,
    "TempDirTestCase": _TESTING,
    "are_the_same_tensors": _TESTING,
    "assert_exception": _TESTING,
    "capture_call_output": _TESTING,
    "device_count": _TESTING,
    "execute_subprocess_async": _TESTING,
    "get_backend": _TESTING,
    "get_launch_command": _TESTING,
    "get_torch_dist_unique_port": _TESTING,
    "memory_allocated_func": _TESTING,
    "parse_flag_from_env": _TESTING,
    "path_in_accelerate_package": _TESTING,
    "pytest_xdist_worker_id": _TESTING,
    "run_command": _TESTING,
    "run_first": _TESTING,
    "skip": _TESTING,
    "slow": _TESTING,
    "torch_device": _TESTING,
    "require_aim": _TESTING,
    "require_bnb": _TESTING,
    "require_clearml": _TESTING,
    "require_comet_ml": _TESTING,
    "require_cpu": _TESTING,
    "require_cuda": _TESTING,
    "require_cuda_or_hpu": _TESTING,
    "require_cuda_or_xpu": _TESTING,
    "require_datasets": _TESTING,
    "require_deepspeed": _TESTING,
    "require_dvclive": _TESTING,
    "require_fp16": _TESTING,
    "require_fp8": _TESTING,
    "require_fsdp": _TESTING,
    "require_fsdp2": _TESTING,
    "require_huggingface_suite": _TESTING,
    "require_import_timer": _TESTING,
    "require_matplotlib": _TESTING,
    "require_mlflow": _TESTING,
    "require_mlu": _TESTING,
    "require_mps": _TESTING,
    "require_multi_device": _TESTING,
    "require_multi_gpu": _TESTING,
    "require_multi_gpu_or_xpu": _TESTING,
    "require_multi_xpu": _TESTING,
    "require_musa": _TESTING,
    "require_neuron": _TESTING,
    "require_non_cpu": _TESTING,
    "require_non_hpu": _TESTING,
    "require_non_torch_xla": _TESTING,
    "require_non_xpu": _TESTING,
    "require_npu": _TESTING,
    "require_pandas": _TESTING,
    "require_peft": _TESTING,
    "require_pippy": _TESTING,
    "require_schedulefree": _TESTING,
    "require_sdaa": _TESTING,
    "require_single_device": _TESTING,
    "require_single_gpu": _TESTING,
    "require_single_xpu": _TESTING,
    "require_swanlab": _TESTING,
    "require_tensorboard": _TESTING,
    "require_timm": _TESTING,
    "require_torch_min_version": _TESTING,
    "require_torchao": _TESTING,
    "require_torchdata_stateful_dataloader": _TESTING,
    "require_torchvision": _TESTING,
    "require_tp": _TESTING,
    "require_tpu": _TESTING,
    "require_trackers": _TESTING,
    "require_trackio": _TESTING,
    "require_transformer_engine": _TESTING,
    "require_transformer_engine_mxfp8": _TESTING,
    "require_transformers": _TESTING,
    "require_triton": _TESTING,
    "require_wandb": _TESTING,
    "require_xpu": _TESTING,
    "RegressionModel": _TRAINING,
    "RegressionDataset": _TRAINING,
    "RegressionModel4XPU": _TRAINING,
    "mocked_dataloaders": _TRAINING,
    "mocked_dataloaders_for_autoregressive_models": _TRAINING,
    "run_distributed": _DISTRIBUTED,
    "launch_script": _DISTRIBUTED,
    "DistributedTestError": _DISTRIBUTED,
    "get_free_port": _DISTRIBUTED,
    "execute_subprocess": _DISTRIBUTED,
}

#: The check scripts the reference re-exports as modules (``from accelerate.test_utils import test_sync``;
#: ``debug_launcher(test_sync.main)``).
_SCRIPTS = ("test_ops", "test_script", "test_sync")

__all__ = [*_EXPORTS, *_SCRIPTS]

_names = lazy_getattr(__name__, _EXPORTS, globals(), submodules=True)


def __getattr__(name: str) -> Any:
    """Resolve an exported name, a check-script module or a submodule on first use.

    Raises:
        AttributeError: for a name this package does not offer.
    """
    if name in _SCRIPTS:
        module = importlib.import_module(f"{__name__}.scripts.{name}")
        globals()[name] = module
        return module
    return _names(name)
