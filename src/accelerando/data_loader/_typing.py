"""Typed keyword arguments of the loaders (annotations only: import under ``if TYPE_CHECKING:``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias, TypedDict

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data import Dataset

    from accelerando.core.enums_on_demand import RNGType

__all__ = ["DataLoaderKwargs", "DataLoaderOptions", "DispatcherArgs", "LoaderArgs", "RngTypes", "ShardArgs"]

# Random generators to synchronise between processes, by name ("torch", "cuda", "generator", ...).
RngTypes: TypeAlias = "Sequence[str | RNGType]"


class DataLoaderOptions(TypedDict, total=False):
    """The keyword arguments ``torch.utils.data.DataLoader`` takes besides ``dataset`` and ``batch_sampler``."""

    batch_size: int | None
    shuffle: bool | None
    # Indices; without batching (batch_size=None), what the dataset's __getitem__ takes: index lists.
    sampler: Iterable[int] | Iterable[list[int]] | None
    num_workers: int
    # The collate function is called with a list of samples of the dataset's (any) type.
    collate_fn: Callable[..., object] | None
    pin_memory: bool
    drop_last: bool
    timeout: float
    worker_init_fn: Callable[[int], None] | None
    # A multiprocessing context or its name ("spawn", "fork"...).
    multiprocessing_context: object
    generator: torch.Generator | None
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory_device: str
    in_order: bool


class DataLoaderKwargs(DataLoaderOptions, total=False):
    """The keyword arguments ``torch.utils.data.DataLoader`` takes besides ``dataset``."""

    batch_sampler: Iterable[list[int]] | None


class LoaderArgs(DataLoaderKwargs):
    """A dataset with the ``DataLoader`` keyword arguments that read it (one process's share)."""

    dataset: Dataset[object]


class ShardArgs(DataLoaderKwargs, total=False):
    """What a ``DataLoaderShard`` was built with (its copies are built with the same)."""

    device: torch.device | str | None
    rng_types: RngTypes | None
    synchronized_generator: torch.Generator | None
    use_stateful_dataloader: bool
    _drop_last: bool
    _non_blocking: bool
    torch_device_mesh: DeviceMesh | None


class DispatcherArgs(DataLoaderKwargs, total=False):
    """What a ``DataLoaderDispatcher`` was built with (its copies are built with the same)."""

    split_batches: bool
    use_stateful_dataloader: bool
    _drop_last: bool
    _non_blocking: bool
    slice_fn: Callable[..., object] | None
    torch_device_mesh: DeviceMesh | None
    device: torch.device | str | None
    rng_types: RngTypes | None
    even_batches: bool
