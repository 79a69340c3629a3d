"""Which DeepSpeed accelerator a run uses: DeepSpeed reads ``DS_ACCELERATOR`` once, when it is imported."""

from __future__ import annotations

import os
import sys

__all__ = ["prefer_deepspeed_cpu_accelerator"]


def prefer_deepspeed_cpu_accelerator(device_type: str) -> bool:
    """Point DeepSpeed at its CPU accelerator when this run trains on the CPU; say whether it did.

    DeepSpeed picks its accelerator at import time and, without CUDA, otherwise fails to find one;
    so before the first ``import deepspeed`` of a CPU run, ``DS_ACCELERATOR`` is set to ``cpu``.
    A value the user set is kept, and nothing changes once DeepSpeed is imported.
    """
    if device_type != "cpu" or "deepspeed" in sys.modules or os.environ.get("DS_ACCELERATOR"):
        return False
    os.environ["DS_ACCELERATOR"] = "cpu"
    return True
