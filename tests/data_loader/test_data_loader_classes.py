"""The loader classes as the reference's users build them directly (not through ``prepare``)."""

from __future__ import annotations

import pytest
from torch.utils.data import BatchSampler, DataLoader

from accelerando.data_loader import DataLoaderDispatcher, DataLoaderShard
from accelerando.data_loader.prepare import SkipDataLoader


def _build(cls: type, **kwargs) -> DataLoader:
    extra = {"skip_batches": 2} if cls is SkipDataLoader else {}
    return cls(list(range(16)), batch_size=4, **extra, **kwargs)


@pytest.mark.parametrize("cls", [DataLoaderShard, DataLoaderDispatcher, SkipDataLoader])
def test_use_stateful_dataloader_gives_a_torchdata_loader(cls: type) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = _build(cls, use_stateful_dataloader=True)
    assert isinstance(loader, cls) and isinstance(loader, stateful.StatefulDataLoader)
    assert loader.use_stateful_dataloader
    assert loader.base_dataloader is loader
    batches = [b.tolist() for b in loader]
    assert batches[-1] == [12, 13, 14, 15]
    plain = _build(cls)
    assert not isinstance(plain, stateful.StatefulDataLoader)
    assert plain.base_dataloader is plain


def test_base_dataloader_is_per_instance_and_gradient_state_is_a_view() -> None:
    with pytest.raises(AttributeError):
        _ = DataLoaderShard.base_dataloader
    loader = _build(DataLoaderShard)
    assert loader.gradient_state.end_of_dataloader is False


def test_set_epoch_reaches_a_custom_batch_sampler() -> None:
    class EpochBatchSampler(BatchSampler):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    batch_sampler = EpochBatchSampler(range(16), 4, False)
    loader = DataLoaderShard(list(range(16)), batch_sampler=batch_sampler)
    loader.set_epoch(3)
    assert batch_sampler.epoch == 3
