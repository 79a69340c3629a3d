"""Memory and resource monitoring, profiling, and the out-of-memory helpers, in one place.

- ``readers``: read this process's memory, its children's, and the accelerator's counters and sensors.
- ``monitor``: :class:`MemoryMonitor`, per-step samples with a leak warning and a record at the end.
- ``profiling``: ``torch.profiler`` helpers behind ``Accelerator.profile()`` and a one-step memory
  profile.
- ``oom``: :func:`find_executable_batch_size`, :func:`release_memory`, :func:`should_reduce_batch_size`.

Names are resolved lazily (PEP 562): reading one imports only the module that defines it, so
importing this package loads neither torch's profiler nor any optional library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerando.core._lazy import lazy_getattr

_EXPORTS: dict[str, str] = {
    "MemoryMonitor": "accelerando.backends.monitoring.monitor",
    "linear_trend": "accelerando.backends.monitoring.monitor",
    "MemoryProfileReport": "accelerando.backends.monitoring.profiling",
    "build_profiler": "accelerando.backends.monitoring.profiling",
    "profile_context": "accelerando.backends.monitoring.profiling",
    "profile_memory_step": "accelerando.backends.monitoring.profiling",
    "BatchSizeFinder": "accelerando.backends.monitoring.oom",
    "find_executable_batch_size": "accelerando.backends.monitoring.oom",
    "release_memory": "accelerando.backends.monitoring.oom",
    "should_reduce_batch_size": "accelerando.backends.monitoring.oom",
}

__all__ = list(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS, globals(), submodules=True)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - static analysers only
    from accelerando.backends.monitoring.monitor import MemoryMonitor, linear_trend  # noqa: F401
    from accelerando.backends.monitoring.oom import (  # noqa: F401
        BatchSizeFinder,
        find_executable_batch_size,
        release_memory,
        should_reduce_batch_size,
    )
    from accelerando.backends.monitoring.profiling import (  # noqa: F401
        MemoryProfileReport,
        build_profiler,
        profile_context,
        profile_memory_step,
    )
