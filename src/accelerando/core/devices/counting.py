"""Counting the GPUs a process started here would see, without importing torch or initialising CUDA.

The launcher decides how many processes to start before any of them imports torch, so the count
comes from the NVIDIA driver's ``/proc`` entries and ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import os

__all__ = ["visible_gpu_count"]


def visible_gpu_count() -> int:
    """Count NVIDIA GPUs visible to this process, without initialising CUDA.

    Returns:
        The number of entries in ``CUDA_VISIBLE_DEVICES`` when it is set, else the number of GPUs the
        NVIDIA driver lists under ``/proc/driver/nvidia/gpus`` (0 without a driver).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    # os, not pathlib: the launcher imports this module, and pathlib (with urllib and ipaddress) costs
    # a one-process launch a tenth of its start-up where nothing else needs it.
    driver = "/proc/driver/nvidia/gpus"
    present = len(os.listdir(driver)) if os.path.isdir(driver) else 0
    if visible is None:
        return present
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(len(ids), present) if present else 0
