"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest


@pytest.fixture
def fresh_state():
    """Forget every Accelerator/process state before and after the test (the Borg states persist)."""
    from accelerando.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
