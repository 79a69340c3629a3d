"""Pinning a process to the CPU cores nearest its GPU (NUMA affinity), read from NVML."""

from __future__ import annotations

import logging
import os

from accelerando.core.devices.families import CUDABackend

__all__ = ["set_numa_affinity"]

logger = logging.getLogger(__name__)


def _gpu_cpu_affinity(device_index: int) -> list[int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        words = max(1, ((os.cpu_count() or 1) + 63) // 64)
        mask_words = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
    finally:
        pynvml.nvmlShutdown()
    cpus = []
    for word_index, word in enumerate(mask_words):
        cpus.extend(word_index * 64 + bit for bit in range(64) if (int(word) >> bit) & 1)
    return cpus


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> bool:
    """Pin this process to the CPUs of the NUMA node closest to its GPU.

    Uses NVML (``pynvml``) to ask which CPUs are local to GPU ``local_process_index``, then
    ``os.sched_setaffinity``. Without NVML, a CUDA device or ``sched_setaffinity`` (non-Linux) this
    logs why and changes nothing.

    Args:
        local_process_index: the process's index on its node (the GPU it drives).
        verbose: log the CPUs chosen. The runtime calls this for the ``enable_cpu_affinity`` setting
            (``ACCELERATE_CPU_AFFINITY``) with the ``debug`` setting (``ACCELERATE_DEBUG_MODE``).

    Returns:
        True when the affinity was changed.

    Raises:
        ValueError: if ``local_process_index`` is negative.
    """
    import importlib.util

    if local_process_index < 0:
        raise ValueError(f"local_process_index must be >= 0, got {local_process_index}.")
    verbose = bool(verbose)
    if not hasattr(os, "sched_setaffinity"):
        logger.info("set_numa_affinity: this platform cannot set CPU affinity; nothing changed.")
        return False
    if not CUDABackend.is_available() or importlib.util.find_spec("pynvml") is None:
        logger.info("set_numa_affinity needs a CUDA device and `pip install pynvml`; nothing changed.")
        return False
    # NVML numbers physical GPUs; CUDA_VISIBLE_DEVICES may remap them for this process.
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    device_index = local_process_index
    if local_process_index < len(visible) and visible[local_process_index].isdigit():
        device_index = int(visible[local_process_index])
    cpus = _gpu_cpu_affinity(device_index)
    if not cpus:
        return False
    os.sched_setaffinity(0, cpus)
    if verbose:
        logger.info(
            "Process %d pinned to CPUs %s (NUMA node of GPU %d).", local_process_index, cpus, device_index
        )
    return True
