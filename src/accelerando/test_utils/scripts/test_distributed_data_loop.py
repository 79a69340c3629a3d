"""Checks of data loops whose length does not divide by the number of processes.

For ``accelerando launch`` on any number of processes: ``even_batches`` on and off, training under
``join_uneven_inputs``, ``split_between_processes`` and ``skip_first_batches``. A failed check raises
``AssertionError``.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator
from accelerando.common.operations import gather_object
from accelerando.test_utils.training import RegressionModel

__all__ = [
    "check_even_batches",
    "check_join_uneven_inputs",
    "check_skip_first_batches",
    "check_split_between_processes",
    "main",
]


def _uneven_loader(accelerator: Accelerator, batch_size: int = 1) -> DataLoader:
    # 2 * world + 1 samples: one more than an even share of two batches each
    length = 2 * accelerator.num_processes + 1
    return DataLoader(TensorDataset(torch.arange(length, dtype=torch.float32)), batch_size=batch_size)


def _batch_counts(accelerator: Accelerator) -> list[int]:
    loader = accelerator.prepare(_uneven_loader(accelerator))
    assert isinstance(loader, DataLoader)
    return gather_object([sum(1 for _ in loader)])


def check_even_batches(accelerator: Accelerator) -> None:
    """With ``even_batches`` every process gets as many batches; without it, only the first gets the extra one."""
    world = accelerator.num_processes
    accelerator.even_batches = True
    assert _batch_counts(accelerator) == [3] * world, "even_batches=True must give each process 3 batches"
    accelerator.even_batches = False
    want = [3] + [2] * (world - 1)
    got = _batch_counts(accelerator)
    accelerator.even_batches = True
    assert got == want, f"even_batches=False gave {got} batches per process, expected {want}"


def check_join_uneven_inputs(accelerator: Accelerator) -> None:
    """A DDP training loop with more batches on one process finishes under ``join_uneven_inputs``."""
    model = accelerator.prepare(RegressionModel())
    assert isinstance(model, torch.nn.Module)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.01))
    assert isinstance(optimizer, torch.optim.Optimizer)
    loader = accelerator.prepare(_uneven_loader(accelerator))
    assert isinstance(loader, DataLoader)
    seen = 0
    from torch.distributed.algorithms.join import Joinable

    # Only DDP's wrapper joins (other strategies ignore the list): a plain model has nothing to join.
    joinables: list[Joinable] = [model] if isinstance(model, Joinable) else []
    with accelerator.join_uneven_inputs(joinables, even_batches=False):
        for (x,) in loader:
            accelerator.backward(model(x).sum())
            optimizer.step()
            optimizer.zero_grad()
            seen += 1
    counts = gather_object([seen])
    want = [3] + [2] * (accelerator.num_processes - 1)
    assert counts == want, (
        f"batches per process {counts}, expected {want} (even_batches=False inside the context)"
    )
    assert sum(1 for _ in loader) == 3, "join_uneven_inputs must restore even_batches on exit"


def check_split_between_processes(accelerator: Accelerator) -> None:
    """Every item lands on exactly one process, in order; padding repeats the last item."""
    items = list(range(2 * accelerator.num_processes + 1))
    with accelerator.split_between_processes(items) as mine:
        assert isinstance(mine, list)  # a list's share is a list
        parts = gather_object([list(mine)])
    assert [item for part in parts for item in part] == items, f"split gave {parts}"
    with accelerator.split_between_processes(items, apply_padding=True) as mine:
        assert isinstance(mine, list)
        sizes = gather_object([len(mine)])
    assert len(set(sizes)) == 1, f"padded split sizes differ: {sizes}"


def check_skip_first_batches(accelerator: Accelerator) -> None:
    """``skip_first_batches`` resumes the prepared loader after the given number of batches."""
    loader = accelerator.prepare(_uneven_loader(accelerator))
    assert isinstance(loader, DataLoader)
    full = [batch[0].tolist() for batch in loader]
    resumed = [batch[0].tolist() for batch in accelerator.skip_first_batches(loader, num_batches=1)]
    assert resumed == full[1:], f"after skipping one batch got {resumed}, expected {full[1:]}"


def main() -> None:
    """Run every check; the main process prints a line per check.

    Raises:
        AssertionError: a check failed (the message says which).
    """
    accelerator = Accelerator()
    checks = (
        check_even_batches,
        check_join_uneven_inputs,
        check_split_between_processes,
        check_skip_first_batches,
    )
    for check in checks:
        check(accelerator)
        accelerator.print(f"PASS {check.__name__} on {accelerator.num_processes} process(es)")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
