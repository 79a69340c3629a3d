"""Accelerator.maybe_context_parallel: a no-op without cp, torch's context parallel with it, refused on CPU."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from accelerando import Accelerator
from suite_support import reset_accelerator_state


@pytest.fixture
def accelerator():
    reset_accelerator_state(partial=False)
    yield Accelerator(cpu=True)
    reset_accelerator_state(partial=False)


def test_without_context_parallelism_the_block_just_runs(accelerator) -> None:
    ran = []
    with accelerator.maybe_context_parallel():
        ran.append(True)
    assert ran == [True]


def test_context_parallelism_on_cpu_is_refused_with_the_reason(accelerator, monkeypatch) -> None:
    # The strategy decides (Strategy.context_parallel), from the runtime it was built with: give it a
    # runtime whose parallelism config asks for cp_size=2 on this CPU process.
    config = SimpleNamespace(cp_size=2, cp_handler=None)
    real = accelerator._strategy.runtime
    runtime = SimpleNamespace(
        plugins=SimpleNamespace(parallelism_config=config), mesh=None, device=real.device
    )
    monkeypatch.setattr(accelerator._strategy, "runtime", runtime)
    with pytest.raises(ValueError, match="cp_size=2") as excinfo:
        with accelerator.maybe_context_parallel():
            pass
    assert "cpu" in str(excinfo.value)


def test_scheduler_steps_once_per_data_parallel_group(accelerator) -> None:
    # Under tensor parallelism (tp_size=2 of 2 processes) there is one data-parallel group: the
    # prepared scheduler must step like a single process, not twice per optimizer step.
    config = SimpleNamespace(data_parallel_size=1, cp_size=1)
    state_type = type(accelerator.state)
    with (
        mock.patch.object(state_type, "parallelism_config", new_callable=mock.PropertyMock) as prop,
        mock.patch.object(state_type, "device_mesh", new_callable=mock.PropertyMock) as mesh,
        mock.patch.object(type(accelerator), "num_processes", new_callable=mock.PropertyMock) as procs,
    ):
        prop.return_value, mesh.return_value, procs.return_value = config, object(), 2
        import torch

        optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        scheduler = accelerator.prepare_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, 1))
    assert scheduler.num_processes == 1
