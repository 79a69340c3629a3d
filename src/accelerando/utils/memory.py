"""The reference's import path ``accelerate.utils.memory``.

Re-exports from :mod:`accelerando.backends.monitoring.oom` and :mod:`accelerando.common.memory`.
"""

from __future__ import annotations

from accelerando.backends.monitoring.oom import (
    BatchSizeFinder,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)
from accelerando.common.memory import clear_device_cache

__all__ = [
    "BatchSizeFinder",
    "clear_device_cache",
    "find_executable_batch_size",
    "release_memory",
    "should_reduce_batch_size",
]
