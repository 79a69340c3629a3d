"""The end-to-end check that ``accelerando test`` launches under the current configuration.

Each check trains or evaluates with the public Accelerator API and compares the result with the same
computation done in plain PyTorch in this process:

* training: ``prepare`` + ``backward`` + ``accumulate`` over sharded batches give the parameters of
  full-batch SGD with the same accumulation (so data parallel gradients are averaged correctly);
* ``gather_for_metrics``: predictions gathered from every process equal the plain model's
  predictions, in order, with the padding of the last uneven batch dropped.

The main process prints one PASS/FAIL line per check; the exit status is 1 when any check failed.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader

from accelerando import Accelerator
from accelerando.test_utils.training import RegressionDataset, RegressionModel

__all__ = ["check_training", "check_gather_for_metrics", "main"]

_BATCH = 4
_LR = 0.1


def _tolerance(accelerator: Accelerator) -> float:
    return 1e-5 if accelerator.mixed_precision == "no" else 5e-2


def _plain_training(dataset: RegressionDataset, global_batch: int, steps: int) -> RegressionModel:
    """Full-batch SGD in one process, accumulating ``steps`` batches per update, as the reference."""
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=_LR)
    batches = list(DataLoader(dataset, batch_size=global_batch))
    for index, batch in enumerate(batches):
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]) / steps
        loss.backward()
        if (index + 1) % steps == 0 or index == len(batches) - 1:
            optimizer.step()
            optimizer.zero_grad()
    return model


def check_training(accelerator: Accelerator) -> tuple[bool, str]:
    """Train with prepare/backward/accumulate and compare with plain full-batch SGD.

    Args:
        accelerator: the Accelerator under test.

    Returns:
        ``(passed, detail)``.
    """
    dataset = RegressionDataset(length=_BATCH * accelerator.num_processes * 8, seed=42)
    model = RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=_LR)
    loader = DataLoader(dataset, batch_size=_BATCH)
    prepared = accelerator.prepare(model, optimizer, loader)
    assert isinstance(prepared, tuple)
    model, optimizer, loader = prepared
    assert isinstance(model, torch.nn.Module)
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert isinstance(loader, DataLoader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    steps = accelerator.gradient_accumulation_steps
    expected = _plain_training(dataset, _BATCH * accelerator.num_processes, steps)
    unwrapped = accelerator.unwrap_model(model)
    assert isinstance(unwrapped, RegressionModel)
    got = (unwrapped.a.item(), unwrapped.b.item())
    want = (expected.a.item(), expected.b.item())
    error = max(abs(got[0] - want[0]), abs(got[1] - want[1]))
    detail = f"a={got[0]:.5f} b={got[1]:.5f} vs plain torch a={want[0]:.5f} b={want[1]:.5f} "
    detail += f"(accumulation steps {steps}, max error {error:.2e})"
    return error <= _tolerance(accelerator), detail


def check_gather_for_metrics(accelerator: Accelerator) -> tuple[bool, str]:
    """Evaluate on an uneven dataset and compare the gathered predictions with plain torch.

    Args:
        accelerator: the Accelerator under test.

    Returns:
        ``(passed, detail)``.
    """
    dataset = RegressionDataset(length=_BATCH * accelerator.num_processes * 3 + 1, seed=7)
    model = RegressionModel(a=1.5, b=-0.5)
    loader = accelerator.prepare(DataLoader(dataset, batch_size=_BATCH))
    assert isinstance(loader, DataLoader)
    prepared = accelerator.prepare(model)
    assert isinstance(prepared, torch.nn.Module)
    predictions = []
    with torch.no_grad():
        for batch in loader:
            predictions.append(accelerator.gather_for_metrics(prepared(batch["x"])))
    got = torch.cat([p.reshape(-1).float().cpu() for p in predictions])
    expected = torch.from_numpy(dataset.x) * 1.5 - 0.5
    if got.shape != expected.shape:
        return False, f"gathered {got.numel()} predictions for {len(dataset)} samples"
    error = float((got - expected).abs().max())
    return error <= _tolerance(accelerator), f"{got.numel()} predictions, max error {error:.2e}"


def main() -> int:
    """Run every check and report on the main process.

    Returns:
        0 when every check passed, else 1.
    """
    accelerator = Accelerator()
    accelerator.print(
        f"accelerando test: {accelerator.num_processes} process(es), device {accelerator.device}, "
        f"mixed precision {accelerator.mixed_precision}, distributed type {accelerator.distributed_type}"
    )
    checks: list[tuple[str, Callable[[Accelerator], tuple[bool, str]]]] = [
        ("training (prepare, backward, accumulate) matches plain torch", check_training),
        ("gather_for_metrics returns every prediction in order", check_gather_for_metrics),
    ]
    failed = 0
    for name, check in checks:
        try:
            passed, detail = check(accelerator)
        except Exception as err:  # noqa: BLE001 - a crashed check is reported as a failure
            passed, detail = False, f"{type(err).__name__}: {err}"
        failed += not passed
        accelerator.print(f"{'PASS' if passed else 'FAIL'}: {name}: {detail}")
    accelerator.print(
        "accelerando test: all checks passed." if not failed else f"accelerando test: {failed} failed."
    )
    _close_process_group(accelerator)
    return 1 if failed else 0


def _close_process_group(accelerator: Accelerator) -> None:
    """Tear gloo down before exit: its threads can abort a process that exits while peers close.

    Order matters. A DDP model holds the process group; dropped after ``destroy_process_group`` it
    runs gloo's destructor with the GIL held, which joins a gloo thread that may still be releasing
    the last collective's tensors and needs the GIL: a deadlock (seen once in a dozen runs). So the
    prepared objects go first, then every process meets at a barrier, then the gloo threads get a
    moment (``time.sleep`` releases the GIL) to finish with the barrier's work, then the group goes.
    """
    accelerator.free_memory()
    gc.collect()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    torch.distributed.barrier()
    time.sleep(0.2)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
