"""Helpers for testing accelerando and scripts built on it.

- ``RegressionModel`` / ``RegressionDataset``: a tiny linear model and matching synthetic data.
- ``run_distributed``: run a function in N real processes (torchrun-style environment, gloo on CPU).
- ``launch_script``: run a script under ``python -m torch.distributed.run`` and fail with its output.
"""

from __future__ import annotations

from accelerando._lazy import lazy_getattr

_EXPORTS = {
    "RegressionModel": "accelerando.test_utils.training",
    "RegressionDataset": "accelerando.test_utils.training",
    "RegressionModel4XPU": "accelerando.test_utils.training",
    "run_distributed": "accelerando.test_utils.distributed",
    "launch_script": "accelerando.test_utils.distributed",
    "DistributedTestError": "accelerando.test_utils.distributed",
    "get_free_port": "accelerando.test_utils.distributed",
    "execute_subprocess": "accelerando.test_utils.distributed",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals(), submodules=True)
