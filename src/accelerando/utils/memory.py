"""The reference's import path for the out-of-memory helpers: ``accelerando.utils.memory``.

They live in :mod:`accelerando.monitoring.oom`; this module re-exports them.
"""

from __future__ import annotations

from accelerando.monitoring.oom import (
    BatchSizeFinder,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)

__all__ = ["BatchSizeFinder", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]
