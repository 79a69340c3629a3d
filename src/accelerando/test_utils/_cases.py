"""``unittest.TestCase`` bases: state reset after each test, a per-class temporary folder, mocks."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path
from typing import Protocol

from accelerando.state import AcceleratorState, PartialState

__all__ = ["AccelerateTestCase", "MockingTestCase", "TempDirTestCase"]


class AccelerateTestCase(unittest.TestCase):
    """Forgets the process and Accelerator state after every test.

    The states are shared by every instance in a process, so a test that builds an ``Accelerator``
    would otherwise leak its settings (mixed precision, plugins, ...) into the next test.
    """

    def tearDown(self) -> None:
        """Reset ``AcceleratorState`` and ``PartialState`` after the test."""
        super().tearDown()

        AcceleratorState._reset_state(reset_partial_state=True)
        PartialState._reset_state()


class TempDirTestCase(unittest.TestCase):
    """Gives the class one temporary folder, ``self.tmpdir`` (a ``Path``), removed after the class.

    When ``clear_on_setup`` is True (the default) the folder is emptied before every test; set it to
    False in a subclass to let tests see what earlier ones wrote.
    """

    clear_on_setup: bool = True
    tmpdir: Path

    @classmethod
    def setUpClass(cls) -> None:
        """Create the class's temporary folder."""
        super().setUpClass()
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls) -> None:
        """Delete the class's temporary folder and everything in it."""
        shutil.rmtree(cls.tmpdir, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        """Empty the temporary folder when ``clear_on_setup``."""
        super().setUp()
        if self.clear_on_setup:
            for entry in self.tmpdir.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()


class _Patcher(Protocol):
    """A ``unittest.mock.patch(...)`` object: started, then stopped."""

    def start(self) -> object: ...

    def stop(self) -> object: ...


class MockingTestCase(unittest.TestCase):
    """Starts ``unittest.mock`` patchers for a test and stops them when it ends.

    Call ``self.add_mocks(patcher_or_list)`` in ``setUp`` (or in the test).
    """

    mocks: list[_Patcher]

    def add_mocks(self, mocks: _Patcher | list[_Patcher] | tuple[_Patcher, ...]) -> None:
        """Start each patcher in ``mocks`` (one patcher or a list) and stop it at cleanup.

        Raises:
            AttributeError: an item has no ``start``/``stop`` (it is not a patcher).
        """
        self.mocks = list(mocks) if isinstance(mocks, (list, tuple)) else [mocks]
        for mock in self.mocks:
            mock.start()
            self.addCleanup(mock.stop)
