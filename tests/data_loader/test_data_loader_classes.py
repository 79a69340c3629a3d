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


def test_a_dropped_accelerator_and_loader_are_freed_mid_iteration(fresh_state: None) -> None:
    """No reference cycle or process-wide strong reference keeps them alive (no gc pass needed)."""
    import gc
    import weakref

    from accelerando import Accelerator

    gc.disable()
    try:
        accelerator = Accelerator(cpu=True)
        loader = accelerator.prepare_data_loader(DataLoader(list(range(16)), batch_size=4))
        iterator = iter(loader)
        assert next(iterator).tolist() == [0, 1, 2, 3]
        assert accelerator.gradient_state.active_dataloader is loader
        refs = weakref.ref(accelerator), weakref.ref(loader)
        del accelerator, loader, iterator
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("shards", "rank", "expected"), [(2, 1, [[6, 7, 8, 9], [10, 11]]), (3, 1, [[8, 9, 10, 11]])]
)
def test_a_streaming_dataset_with_a_shard_per_process_reads_its_own_shards(shards, rank, expected) -> None:
    """Observed on the reference library: contiguous runs of file shards per process, no sample-level split."""
    datasets = pytest.importorskip("datasets")
    from accelerando.data_loader import IterableDatasetShard, prepare_data_loader

    data = datasets.Dataset.from_dict({"x": list(range(12))}).to_iterable_dataset(num_shards=shards)
    loader = prepare_data_loader(
        DataLoader(data, batch_size=4), num_processes=2, process_index=rank, dispatch_batches=False
    )
    assert not isinstance(loader.dataset, IterableDatasetShard)
    assert [batch["x"].tolist() for batch in loader] == expected
