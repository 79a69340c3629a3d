"""A prepared stateful loader's first epoch, saved mid-way and loaded into a freshly prepared loader,
continues with the same order (the first iterator replays the seeds drawn at ``prepare``: the saved
state must be the one that iterator was created from)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchdata.stateful_dataloader")


def _prepared(accelerator: object, own_generator: bool) -> object:
    generator = torch.Generator().manual_seed(0) if own_generator else None
    data = list(range(48))
    return accelerator.prepare(
        torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=generator)
    )


@pytest.mark.parametrize("own_generator", [True, False])
def test_first_epoch_resumes_with_the_same_order(own_generator: bool, fresh_state: None) -> None:
    from accelerando import Accelerator, DataLoaderConfiguration

    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)
    )
    torch.manual_seed(0)
    loader = _prepared(accelerator, own_generator)
    order, state = [], None
    for index, batch in enumerate(loader):
        order.append(batch.tolist())
        if index == 2:
            state = loader.state_dict()
    resumed = _prepared(accelerator, own_generator)
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == order[3:]
