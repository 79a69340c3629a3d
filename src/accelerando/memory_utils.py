"""Public alias module: ``accelerando.memory_utils`` re-exports the memory helpers of ``accelerando.backends.monitoring.oom``."""

from __future__ import annotations

from accelerando.backends.monitoring.oom import find_executable_batch_size, release_memory

__all__ = ["find_executable_batch_size", "release_memory"]
