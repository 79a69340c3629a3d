"""The reference's import path for memory helpers: ``accelerando.utils.memory``.

The out-of-memory helpers live in :mod:`accelerando.monitoring.oom` and are re-exported here;
:func:`clear_device_cache` is defined here.
"""

from __future__ import annotations

import gc

import torch

from accelerando.monitoring.oom import (
    BatchSizeFinder,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

__all__ = [
    "BatchSizeFinder",
    "clear_device_cache",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
]


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Give the memory the accelerator's caching allocator keeps back to the device.

    Every accelerator family present is emptied (CUDA, XPU, NPU, HPU, MPS...). A CUDA runtime that
    was never initialised holds no cache and is left alone, so calling this never initialises CUDA.

    Args:
        garbage_collection: run Python's garbage collector first, so that tensors only unreachable
            objects still hold are freed too.
    """
    from accelerando.devices import DEVICE_BACKENDS

    if garbage_collection:
        gc.collect()
    for backend in DEVICE_BACKENDS:
        if backend.name == "cuda" and not torch.cuda.is_initialized():
            continue
        try:
            backend.empty_cache()
        except (RuntimeError, AttributeError):
            continue  # a family whose runtime refuses (not present on this machine)
