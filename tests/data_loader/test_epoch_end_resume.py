"""Exact resume from a checkpoint taken after any batch, the last batch of an epoch included.

Training has dropout (draws from the global generator), a shuffled loader and a StepLR scheduler. A
run saves after batch ``i`` of epoch ``e``, a fresh run loads that checkpoint and continues the way
the reference's examples do (start epoch and batches to skip from the number of steps taken); its
final weights must equal, bit for bit, those of a run that was never interrupted. One process runs
in the test process; two processes run every case in one launch.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accelerando.test_utils import run_distributed
from suite_support import reset_accelerator_state

EPOCHS = 2
LENGTH = 10
BATCH = 2


def _train(
    folder: str, stateful: bool, save_at: tuple[int, int] | None, resume: bool, skip_zero: bool
) -> dict[str, torch.Tensor]:
    """Train EPOCHS epochs; save after batch save_at=(epoch, i), or resume from that save."""
    from accelerando import Accelerator
    from accelerando.utils import DataLoaderConfiguration, set_seed

    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    data = TensorDataset(torch.randn(LENGTH, 4), torch.randn(LENGTH, 1))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful)
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    per_epoch = len(loader)
    start_epoch, skip = 0, 0
    if resume:
        assert save_at is not None
        accelerator.load_state(folder)
        done = save_at[0] * per_epoch + save_at[1] + 1  # steps taken before the save
        start_epoch, skip = divmod(done, per_epoch)
        if stateful:
            skip = 0  # the loader restored its position itself
    for epoch in range(start_epoch, EPOCHS):
        batches = accelerator.skip_first_batches(loader, skip) if (skip or skip_zero) else loader
        skip = 0
        for i, (x, y) in enumerate(batches):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if not resume and save_at == (epoch, i):
                accelerator.save_state(folder)
    return {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def _positions(per_epoch: int) -> list[tuple[int, int]]:
    """First, middle and last batch of the first epoch; first and last of the second (the last one
    of the run is included: resuming there leaves nothing to train, and must still match)."""
    last = per_epoch - 1
    return sorted({(0, 0), (0, last // 2), (0, last), (1, 0), (1, last)})


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def resume_everywhere(stateful: bool, per_epoch: int) -> list[tuple[tuple[int, int], bool, float]]:
    """Every save position, with and without skip_first_batches(loader, 0): max abs difference."""
    import torch.distributed as dist

    # A skip_first_batches copy starts its own iterator (with a stateful loader, the prepared loader
    # had drawn its first one's seeds at prepare, as the reference's does): each variant is compared
    # with an uninterrupted run that iterates the same way.
    references = {skip_zero: _train("", stateful, None, False, skip_zero) for skip_zero in (False, True)}
    results = []
    with tempfile.TemporaryDirectory() as root:
        for position in _positions(per_epoch):
            for skip_zero in (False, True):
                reference = references[skip_zero]
                folder = os.path.join(root, f"ckpt_{position[0]}_{position[1]}_{int(skip_zero)}")
                if dist.is_initialized():
                    # every rank must save into the same folder
                    names = [folder]
                    dist.broadcast_object_list(names, src=0)
                    folder = names[0]
                _train(folder, stateful, position, False, skip_zero)
                resumed = _train(folder, stateful, position, True, skip_zero)
                results.append((position, skip_zero, _max_difference(reference, resumed)))
    return results


@pytest.mark.parametrize("stateful", [False, True], ids=["default", "stateful"])
def test_resume_one_process(stateful: bool) -> None:

    reset_accelerator_state()
    for position, skip_zero, difference in resume_everywhere(stateful, LENGTH // BATCH):
        assert difference == 0.0, f"save after {position}, skip_first_batches(…, 0)={skip_zero}: {difference}"


@pytest.mark.slow
def test_resume_two_processes() -> None:
    per_epoch = -(-LENGTH // (BATCH * 2))
    outcomes = run_distributed(_two_process_cases, 2, per_epoch)
    for stateful, results in outcomes[0]:
        for position, skip_zero, difference in results:
            assert difference == 0.0, (
                f"stateful={stateful}, save after {position}, skip0={skip_zero}: {difference}"
            )


def _two_process_cases(per_epoch: int) -> list:
    return [(stateful, resume_everywhere(stateful, per_epoch)) for stateful in (False, True)]
