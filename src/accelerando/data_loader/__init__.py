"""Data loading for several processes: sharding, dispatching, exact resume and device placement.

``prepare_data_loader`` turns a ``torch.utils.data.DataLoader`` into a ``DataLoaderShard`` (each
process reads its own shard) or a ``DataLoaderDispatcher`` (the main process reads and sends each
process its slice); ``skip_first_batches`` resumes inside an epoch without loading skipped samples.
"""

from __future__ import annotations

from accelerando.data_loader.adapter import DataLoaderAdapter, DataLoaderStateMixin, get_sampler
from accelerando.data_loader.dispatcher import DataLoaderDispatcher
from accelerando.data_loader.prepare import (
    SkipBatchSampler,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from accelerando.data_loader.samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler
from accelerando.data_loader.shard import DataLoaderShard

__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderStateMixin",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]
