"""Accelerator.maybe_context_parallel: a no-op without cp, torch's context parallel with it, refused on CPU."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from accelerando import Accelerator
from accelerando.state import AcceleratorState, GradientState


@pytest.fixture
def accelerator():
    AcceleratorState._reset_state()
    GradientState._reset_state()
    yield Accelerator(cpu=True)
    AcceleratorState._reset_state()
    GradientState._reset_state()


def test_without_context_parallelism_the_block_just_runs(accelerator) -> None:
    ran = []
    with accelerator.maybe_context_parallel():
        ran.append(True)
    assert ran == [True]


def test_context_parallelism_on_cpu_is_refused_with_the_reason(accelerator) -> None:
    config = SimpleNamespace(cp_size=2, cp_handler=None)
    with (
        mock.patch.object(
            type(accelerator.state), "parallelism_config", new_callable=mock.PropertyMock
        ) as prop,
        pytest.raises(ValueError, match="cp_size=2") as excinfo,
    ):
        prop.return_value = config
        with accelerator.maybe_context_parallel():
            pass
    assert "cpu" in str(excinfo.value)
