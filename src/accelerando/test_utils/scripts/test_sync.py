"""Checks of gradient synchronisation (``no_sync``, ``accumulate``) for ``accelerando launch``.

Each process feeds data that depends on its rank, so local gradients differ between processes; a
synchronised step must leave the average of the local gradients on every process, an unsynchronised
one the local gradient. A failed check raises ``AssertionError``.
"""

from __future__ import annotations

import torch

from accelerando import Accelerator
from accelerando.common.operations import gather
from accelerando.test_utils.testing import are_the_same_tensors
from accelerando.test_utils.training import RegressionModel

__all__ = ["check_accumulate", "check_no_sync", "main"]


def _batch(accelerator: Accelerator, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    rank = accelerator.process_index
    x = torch.tensor([rank + 1.0 + step, 2.0 - step], device=accelerator.device)
    y = torch.tensor([1.0, 3.0 * rank + step], device=accelerator.device)
    return x, y


def _grads(model: torch.nn.Module) -> torch.Tensor:
    grads = []
    for p in model.parameters():
        assert p.grad is not None  # read after a backward, which gives every parameter one
        grads.append(p.grad.detach().reshape(-1)[0])
    return torch.stack(grads)


def _local_grads(x: torch.Tensor, y: torch.Tensor, divide_by: int = 1) -> torch.Tensor:
    """The gradient this process would get alone (same initial weights as the prepared model)."""
    model = RegressionModel().to(x.device)
    loss = torch.nn.functional.mse_loss(model(x), y) / divide_by
    loss.backward()
    return _grads(model)


def check_no_sync(accelerator: Accelerator) -> None:
    """Under ``no_sync`` gradients stay local; outside it they are averaged over processes."""
    model = accelerator.prepare(RegressionModel())
    assert isinstance(model, torch.nn.Module)
    x, y = _batch(accelerator, 0)
    steps = accelerator.gradient_accumulation_steps
    with accelerator.no_sync(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    local = _local_grads(x, y, steps)
    assert torch.allclose(_grads(model), local), f"no_sync: {_grads(model)} is not the local {local}"
    if accelerator.num_processes > 1:
        assert not are_the_same_tensors(_grads(model)), "no_sync: gradients were synchronised"
    model.zero_grad()
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    average = gather(local[None]).mean(dim=0)
    assert torch.allclose(_grads(model), average), (
        f"synced step: {_grads(model)} is not the average {average}"
    )
    assert are_the_same_tensors(_grads(model)), "synced step: processes disagree"


def check_accumulate(accelerator: Accelerator) -> None:
    """Inside ``accumulate`` only every ``gradient_accumulation_steps``-th step synchronises."""
    steps = accelerator.gradient_accumulation_steps
    model = accelerator.prepare(RegressionModel())
    assert isinstance(model, torch.nn.Module)
    local = torch.zeros(2, device=accelerator.device)
    for step in range(2 * steps):
        x, y = _batch(accelerator, step)
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            local = local + _local_grads(x, y, steps)
            boundary = (step + 1) % steps == 0
            assert accelerator.sync_gradients == boundary, (
                f"step {step}: sync_gradients is {accelerator.sync_gradients}"
            )
            if boundary:
                average = gather(local[None]).mean(dim=0)
                assert torch.allclose(_grads(model), average, atol=1e-6), (
                    f"step {step}: {_grads(model)} != {average}"
                )
                model.zero_grad()
                local = torch.zeros(2, device=accelerator.device)
            else:
                assert torch.allclose(_grads(model), local, atol=1e-6), (
                    f"step {step}: gradients left the process"
                )


def main() -> None:
    """Run the checks with two accumulation steps; the main process prints a line per check.

    Raises:
        AssertionError: a check failed (the message says which).
    """
    accelerator = Accelerator(gradient_accumulation_steps=2)
    for check in (check_no_sync, check_accumulate):
        check(accelerator)
        accelerator.print(f"PASS {check.__name__} on {accelerator.num_processes} process(es)")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
