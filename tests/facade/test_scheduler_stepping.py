"""AcceleratedScheduler follows the optimizer: N schedule steps per real step on N processes, none
after a skipped (overflowed) step."""

from __future__ import annotations

import pytest
import torch

from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler


def _scheduler(
    num_processes: int, split_batches: bool = False
) -> tuple[AcceleratedOptimizer, AcceleratedScheduler]:
    model = torch.nn.Linear(2, 2)
    optimizer = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    inner = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, lr_lambda=lambda n: 1 - n / 10)
    return optimizer, AcceleratedScheduler(
        inner, optimizer, split_batches=split_batches, num_processes=num_processes
    )


@pytest.mark.parametrize(
    ("num_processes", "split_batches", "expected"), [(2, False, 0.8), (2, True, 0.9), (1, False, 0.9)]
)
def test_schedule_advances_once_per_process_and_not_after_an_overflow(
    num_processes, split_batches, expected
) -> None:
    optimizer, scheduler = _scheduler(num_processes, split_batches)
    optimizer._is_overflow = False
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(expected)
    optimizer._is_overflow = True  # what a loss scaler's skipped step records (the reference's attribute)
    assert optimizer.step_was_skipped
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(expected)
