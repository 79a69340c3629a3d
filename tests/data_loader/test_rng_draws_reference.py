"""Same seed, same batches and same global generator as the reference, where loaders draw random numbers.

A prepared loader draws from the global generator in places a user does not see: the base seed of
each epoch's iterator, the shuffling seed of one process, and, on the reference's torchdata-based
stateful loader, the first iterator's seeds at ``prepare`` time. A training step draws dropout masks
after those. Each case here records the batches every loader gives and a number drawn from the
global generator after ``prepare`` and after each epoch, in 1 and 2 processes, with the reference
(run in its own processes) and with accelerando; the records must be equal.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accelerando.test_utils import run_distributed

needs_torchdata_and_reference = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None or importlib.util.find_spec("torchdata") is None,
    reason="needs the reference accelerate package and torchdata",
)

# (stateful, dispatch_batches, skip given to skip_first_batches in the first epoch (None: no copy),
#  the train loader's num_workers, a generator of the loader's own)
Case = tuple[bool, bool, "int | None", int, bool]
CASES: list[Case] = [
    (True, False, None, 0, False),  # the reference's checkpointing example: two stateful loaders
    (True, False, 0, 0, False),  # a skip_first_batches(loader, 0) copy starts its own iterator
    (True, False, 2, 0, False),
    (False, False, 2, 0, False),  # skipping without a loaded state draws a new base seed
    (True, False, None, 0, True),  # the seeds come from the loader's generator
    (True, True, None, 0, False),  # dispatched: one reader's order, a base-seed draw on every process
    (False, True, None, 0, False),
]
WORKER_CASE: Case = (True, False, None, 1, False)  # the first iterator's prefetch draws the shuffle seed


def record(library: str, cases: list[Case]) -> list[list[object]]:
    """In each process: per case, the batches given out and a global draw after each phase."""
    module = importlib.import_module(library)
    utils = importlib.import_module(f"{library}.utils")
    out = []
    for stateful, dispatch, skip, workers, own_generator in cases:
        config = utils.DataLoaderConfiguration(use_stateful_dataloader=stateful, dispatch_batches=dispatch)
        accelerator = module.Accelerator(cpu=True, dataloader_config=config)
        utils.set_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
        generator = torch.Generator().manual_seed(3) if own_generator else None
        train = DataLoader(
            TensorDataset(torch.arange(12)),
            batch_size=2,
            shuffle=True,
            num_workers=workers,
            generator=generator,
        )
        evaluation = DataLoader(TensorDataset(torch.arange(4)), batch_size=2)
        model, train, evaluation = accelerator.prepare(model, train, evaluation)
        seen: list[object] = [_peek()]
        for epoch in range(2):
            loader = accelerator.skip_first_batches(train, skip) if skip is not None and epoch == 0 else train
            for (batch,) in loader:
                seen.append(batch.tolist())
                model(torch.ones(2, 2))  # dropout draws from the global generator
            seen.append([batch.tolist() for (batch,) in evaluation])
            seen.append(_peek())
        out.append(seen)
        accelerator.free_memory()
    return out


def _peek() -> float:
    """A number drawn from the global generator, which is left as it was."""
    state = torch.get_rng_state()
    value = float(torch.rand(1).item())
    torch.set_rng_state(state)
    return value


def _compare(processes: int, cases: list[Case]) -> None:
    ours = run_distributed(record, processes, "accelerando", cases)
    theirs = run_distributed(record, processes, "accelerate", cases)
    for rank in range(processes):
        for case, mine, reference in zip(cases, ours[rank], theirs[rank], strict=True):
            assert mine == reference, f"rank {rank}, case {case}:\n ours      {mine}\n reference {reference}"


@needs_torchdata_and_reference
def test_one_process_draws_and_batches_match_reference() -> None:
    _compare(1, [*CASES, WORKER_CASE])


@needs_torchdata_and_reference
@pytest.mark.slow
def test_two_processes_draws_and_batches_match_reference() -> None:
    _compare(2, CASES)


def resumed_order(library: str, folder: str, fresh_order: bool) -> list[list[int]]:
    """Save after 3 batches, then in a new Accelerator load and skip them: the batches that follow.

    With ``fresh_order`` (accelerando only) the loader is told, after ``load_state``, to forget the
    saved epoch's order: the one line the migration page gives for the reference's resume.
    """
    module = importlib.import_module(library)
    utils = importlib.import_module(f"{library}.utils")

    def prepared() -> tuple[object, DataLoader]:
        accelerator = module.Accelerator(cpu=True)
        utils.set_seed(5)
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
        data = DataLoader(TensorDataset(torch.arange(12)), batch_size=2, shuffle=True)
        model, data = accelerator.prepare(model, data)
        return accelerator, data

    accelerator, loader = prepared()
    for step, _batch in enumerate(loader):
        torch.rand(3)
        if step == 2:
            accelerator.save_state(folder)
    accelerator.free_memory()
    accelerator, loader = prepared()
    accelerator.load_state(folder)
    if fresh_order:
        loader.load_state_dict({"epoch": loader.iteration})
    return [batch.tolist() for (batch,) in accelerator.skip_first_batches(loader, 3)]


@needs_torchdata_and_reference
def test_resume_gives_the_same_epoch_and_one_line_gives_the_references_fresh_order(tmp_path) -> None:
    exact = run_distributed(resumed_order, 1, "accelerando", str(tmp_path / "ours"), False)[0]
    fresh = run_distributed(resumed_order, 1, "accelerando", str(tmp_path / "fresh"), True)[0]
    reference = run_distributed(resumed_order, 1, "accelerate", str(tmp_path / "reference"), False)[0]
    assert fresh == reference
    assert exact != reference  # ours continues the saved epoch's order (a deliberate difference)
