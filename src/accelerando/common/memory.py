"""Returning the memory an accelerator's caching allocator holds back to the device."""

from __future__ import annotations

import gc

import torch

from accelerando.core.devices import DEVICE_BACKENDS

__all__ = ["clear_device_cache"]


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Give the memory the accelerator's caching allocator keeps back to the device.

    Every accelerator family present is emptied (CUDA, XPU, NPU, HPU, MPS...). A CUDA runtime that
    was never initialised holds no cache and is left alone, so calling this never initialises CUDA.

    Args:
        garbage_collection: run Python's garbage collector first, so that tensors only unreachable
            objects still hold are freed too.
    """
    if garbage_collection:
        gc.collect()
    for backend in DEVICE_BACKENDS:
        if backend.name == "cuda" and not torch.cuda.is_initialized():
            continue
        try:
            backend.empty_cache()
        except (RuntimeError, AttributeError):
            continue  # a family whose runtime refuses (not present on this machine)
