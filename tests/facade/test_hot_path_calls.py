"""Counted work of the per-micro-batch hot path: Python calls made by ``accumulate``, ``backward`` and the optimizer.

Timing is noisy on a shared machine, so the test counts the Python-level function calls the
Accelerator makes around one micro-batch (``sys.setprofile`` "call" events in accelerando's own
files); a regression that adds a generator, an ExitStack or a settings lookup to the hot path shows
up as a higher count.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch
from torch import nn

from accelerando import Accelerator
from suite_support import reset_accelerator_state


def _calls_in_accelerando(work: Callable[[], None]) -> list[str]:
    calls: list[str] = []

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and "accelerando" in frame.f_code.co_filename:
            calls.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return calls


@pytest.fixture
def prepared():  # type: ignore[no-untyped-def]
    reset_accelerator_state(partial=False)
    acc = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    yield acc, model, opt
    reset_accelerator_state(partial=False)


def test_accumulate_enter_exit_is_a_handful_of_calls(prepared) -> None:  # type: ignore[no-untyped-def]
    acc, model, _ = prepared

    def cycle() -> None:
        for _ in range(2):  # one skipped-sync micro-batch and one sync micro-batch
            with acc.accumulate(model):
                pass

    cycle()
    calls = _calls_in_accelerando(cycle)
    # accumulate, __init__, __enter__, _do_sync, no_sync, __exit__ per micro-batch (no generators).
    assert len(calls) <= 12, calls


def test_micro_batch_step_call_count(prepared) -> None:  # type: ignore[no-untyped-def]
    acc, model, opt = prepared
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    def micro_batches() -> None:
        for _ in range(2):
            with acc.accumulate(model):
                acc.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()

    micro_batches()
    calls = _calls_in_accelerando(micro_batches)
    # + backward (one call: torch's backward directly when neither the strategy nor the precision
    # has its own), step, zero_grad per micro-batch: 17 counted when written.
    assert len(calls) <= 18, calls
