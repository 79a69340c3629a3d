"""``accelerando.profiling``: kept importable for existing callers; the code lives in
:mod:`accelerando.monitoring.profiling`, which new code should import.
"""

from __future__ import annotations

from accelerando.monitoring.profiling import (
    MemoryProfileReport,
    build_profiler,
    profile_context,
    profile_memory_step,
)

__all__ = ["MemoryProfileReport", "build_profiler", "profile_context", "profile_memory_step"]
