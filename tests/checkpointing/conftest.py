"""Fixtures shared by the checkpointing tests."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest


class FsyncCounter:
    """Wraps ``os.fsync`` for a test: records the path each call flushed (from any thread)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        self._real(fd)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncCounter]:
    """Counts the fsync calls of the test (skips where /proc cannot name the flushed files)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name the flushed files")
    counter = FsyncCounter()
    monkeypatch.setattr(os, "fsync", counter)
    yield counter
