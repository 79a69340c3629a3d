"""prepare_data_loader and skip_first_batches: turn a user's DataLoader into a prepared one."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Protocol, TypeGuard, TypeVar, cast

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler

from accelerando.data_loader.adapter import DataLoaderStateMixin
from accelerando.data_loader.dispatcher import DataLoaderDispatcher
from accelerando.data_loader.progress import PreparedLoaderMixin
from accelerando.data_loader.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    _consume,
    _DrawnRandomSampler,
    _GlobalDrawRandomSampler,
)
from accelerando.data_loader.shard import DataLoaderShard, _stateful_base, with_stateful_base
from accelerando.state import PartialState

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data import Dataset
    from typing_extensions import Unpack

    from accelerando.data_loader._typing import DataLoaderKwargs, DataLoaderOptions, LoaderArgs, RngTypes

_END = object()
_PreparedT = TypeVar("_PreparedT", bound=PreparedLoaderMixin)

__all__ = ["SkipBatchSampler", "SkipDataLoader", "prepare_data_loader", "skip_first_batches"]

# DataLoader settings carried over to the prepared loader (the sampling ones are rebuilt).
_CARRIED = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)
_NON_DATA_AXES = ("tp", "cp", "pp")

logger = logging.getLogger(__name__)


def _loader_kwargs(dataloader: DataLoader) -> DataLoaderOptions:
    import inspect

    accepted = inspect.signature(DataLoader.__init__).parameters
    # The DataLoader's own settings, read back by their parameter names.
    kwargs = cast(
        "DataLoaderOptions",
        {
            name: getattr(dataloader, name)
            for name in _CARRIED
            if name in accepted and hasattr(dataloader, name)
        },
    )
    if not kwargs.get("num_workers"):
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    return kwargs


def _data_parallel_layout(num_processes: int, process_index: int, mesh: DeviceMesh | None) -> tuple[int, int]:
    """Data-parallel size and rank: ranks that differ only along tp/cp/pp axes read the same data."""
    if mesh is None:
        return num_processes, process_index
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    inner = 1
    for axis, name in enumerate(names):
        if name in _NON_DATA_AXES:
            inner *= int(mesh.size(axis))
    return max(num_processes // inner, 1), process_index // inner


def _layout(
    num_processes: int | None,
    process_index: int | None,
    device: torch.device | str | int | None,
    mesh: DeviceMesh | None,
) -> tuple[int, int, torch.device]:
    """Fill what the caller left out from ``PartialState``; then keep only data-parallel ranks."""
    if num_processes is None or process_index is None or device is None:
        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
        device = state.device if device is None else device
    return (*_data_parallel_layout(num_processes, process_index, mesh), torch.device(device))


def _check_not_empty(dataset: object) -> None:
    if isinstance(dataset, Sized) and len(dataset) == 0:
        raise ValueError(
            "prepare_data_loader got an empty dataset (len 0): there is nothing to shard between "
            "processes; check the dataset's path or filters, or do not prepare this dataloader."
        )


def _with_sampler(batch_sampler: Iterable[list[int]], sampler: Iterable[int]) -> Iterable[list[int]]:
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
    clone = copy.copy(batch_sampler)
    setattr(clone, "sampler", sampler)  # noqa: B010 - a user's batch sampler class, read by its attribute
    return clone


def _prepare_sampling(
    batch_sampler: Iterable[list[int]],
    use_seedable_sampler: bool,
    data_seed: int | None,
    num_processes: int = 2,
) -> tuple[Iterable[list[int]], torch.Generator | None]:
    """Make shuffling reproducible while drawing the same order as the reference library.

    One process keeps PyTorch's own draw (a seed from the global generator when each epoch starts),
    remembering the seed for resume. Several processes shuffle with a generator of their own, seeded
    once from the global generator and synchronised from the main process at each epoch.
    """
    if isinstance(batch_sampler, BatchSamplerShard) and batch_sampler.num_processes == 1:
        batch_sampler = batch_sampler.batch_sampler  # a loader prepared before: start from its own sampler
    sampler = getattr(batch_sampler, "sampler", None)
    if not isinstance(sampler, RandomSampler) or isinstance(sampler, SeedableRandomSampler):
        return batch_sampler, getattr(sampler, "generator", None) if sampler is not None else None
    if use_seedable_sampler:
        seedable = SeedableRandomSampler(
            sampler.data_source, sampler.replacement, sampler._num_samples, data_seed=data_seed
        )
        return _with_sampler(batch_sampler, seedable), None
    if isinstance(sampler, (_GlobalDrawRandomSampler, _DrawnRandomSampler)):
        sampler = RandomSampler(sampler.data_source, sampler.replacement, sampler._num_samples)
    if sampler.generator is None:
        if num_processes == 1:
            drawn = _GlobalDrawRandomSampler(sampler.data_source, sampler.replacement, sampler._num_samples)
            return _with_sampler(batch_sampler, drawn), None
        # Seeded from the global RNG (so set_seed decides the order), then synchronised at each epoch.
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        owned = _DrawnRandomSampler(
            sampler.data_source, sampler.replacement, sampler._num_samples, generator=generator
        )
        return _with_sampler(batch_sampler, owned), generator
    return batch_sampler, sampler.generator


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: RngTypes | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., object] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: DeviceMesh | None = None,
) -> DataLoader:
    """Wrap ``dataloader`` so that each process gets its share of every epoch.

    Map-style data is sharded at the batch-sampler level (``BatchSamplerShard``), iterable data at
    the sample level (``IterableDatasetShard``), or, with ``dispatch_batches``, read on the main
    process only and scattered (``DataLoaderDispatcher``). Every setting of the original loader
    (workers, collate function, pinning, generator, ...) is kept.

    Args:
        dataloader: The loader to prepare.
        device: Where batches go when ``put_on_device`` (default: this process's device).
        num_processes: Number of processes (default: from ``PartialState``).
        process_index: This process's index (default: from ``PartialState``).
        split_batches: Cut each batch between processes instead of giving each process whole batches;
            the batch size must then be a multiple of ``num_processes``.
        put_on_device: Move every batch to ``device``.
        rng_types: Random generators to synchronise from the main process at each epoch.
        dispatch_batches: Read on the main process and scatter; default True only for iterable
            datasets placed on a device.
        even_batches: Pad the final global batch from the start of the data so that every process
            gets the same number of batches (``GradientState().remainder`` tells the real count).
        slice_fn_for_dispatch: Custom ``slice_fn(batch, slice, process_index=, num_processes=)``.
        use_seedable_sampler: Replace a ``RandomSampler`` by a ``SeedableRandomSampler``.
        data_seed: Seed of that sampler.
        non_blocking: Copy batches asynchronously (with pinned memory on CUDA, one batch ahead).
        use_stateful_dataloader: ``load_state_dict`` restores the position inside the epoch too.
        torch_device_mesh: With tensor/context/pipeline axes, ranks along them share the data.

    Returns:
        A ``DataLoaderShard`` or ``DataLoaderDispatcher``.

    Raises:
        TypeError: When ``dataloader`` is not a ``torch.utils.data.DataLoader``.
        ValueError: On an empty dataset, a batch size that ``split_batches`` cannot divide,
            ``dispatch_batches`` without ``put_on_device``, or unbatched data over several processes.
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"prepare_data_loader needs a torch.utils.data.DataLoader, got {type(dataloader).__name__}."
        )
    dataset = dataloader.dataset
    if dispatch_batches is None:
        dispatch_batches = bool(put_on_device) and isinstance(dataset, IterableDataset)
    if dispatch_batches and not put_on_device:
        raise ValueError(
            "dispatch_batches=True needs put_on_device=True; set both, or dispatch_batches=False."
        )
    num_processes, process_index, device = _layout(
        num_processes, process_index, device if put_on_device else torch.device("cpu"), torch_device_mesh
    )
    _check_not_empty(dataset)
    _check_split(dataloader, split_batches, num_processes)
    kwargs = _loader_kwargs(dataloader)
    target = device if put_on_device else None
    if non_blocking and target is not None and target.type == "cuda":
        kwargs["pin_memory"] = True
    shard_cls, dispatch_cls = DataLoaderShard, DataLoaderDispatcher
    if use_stateful_dataloader:
        shard_cls, dispatch_cls = (
            with_stateful_base(DataLoaderShard),
            with_stateful_base(DataLoaderDispatcher),
        )
    if dispatch_batches:
        # Sampling arguments and carried settings have no key in common.
        sampling: DataLoaderKwargs = {
            **_sampling_kwargs(dataloader, use_seedable_sampler, data_seed),
            **kwargs,
        }
        return _started(
            dispatch_cls(
                dataset,
                split_batches=split_batches,
                _drop_last=dataloader.drop_last,
                slice_fn=slice_fn_for_dispatch,
                torch_device_mesh=torch_device_mesh,
                device=target,
                rng_types=rng_types,
                even_batches=even_batches,
                use_stateful_dataloader=use_stateful_dataloader,
                _non_blocking=non_blocking,
                **sampling,
            )
        )
    if isinstance(dataset, IterableDataset):
        loader_args = _shard_iterable(dataloader, num_processes, process_index, split_batches, even_batches)
        generator = None
    else:
        loader_args, generator = _shard_map_style(
            dataloader,
            num_processes,
            process_index,
            split_batches,
            even_batches,
            use_seedable_sampler,
            data_seed,
        )
    args: LoaderArgs = {**loader_args, **kwargs}
    return _started(
        shard_cls(
            synchronized_generator=generator,
            device=target,
            rng_types=rng_types,
            torch_device_mesh=torch_device_mesh,
            _drop_last=dataloader.drop_last,
            use_stateful_dataloader=use_stateful_dataloader,
            _non_blocking=non_blocking,
            **args,
        )
    )


def _started(loader: _PreparedT) -> _PreparedT:
    """``loader``, having drawn its first iterator's seeds now when it is built on torchdata's base.

    The reference's stateful loader starts its first iterator when ``prepare`` builds it (see
    ``PreparedLoaderMixin._draw_first_iterator_seeds``); its ``skip_first_batches`` copies do not.
    """
    if _stateful_base(type(loader)) is not None:
        loader._draw_first_iterator_seeds()
    return loader


def _check_split(dataloader: DataLoader, split_batches: bool, num_processes: int) -> None:
    if not split_batches:
        return
    size = dataloader.batch_size
    if size is None:
        source = dataloader.batch_sampler or dataloader.sampler
        size = getattr(source, "batch_size", None)
    if size is None:
        raise ValueError(
            "split_batches=True needs a known batch size; give the DataLoader batch_size=... or a batch "
            "sampler with a batch_size attribute, or set split_batches=False."
        )
    if size % num_processes != 0:
        raise ValueError(
            f"split_batches=True needs a batch size that is a round multiple of the number of processes, got "
            f"batch size {size} for {num_processes} processes; use a multiple of {num_processes} (e.g. "
            f"{size - size % num_processes or num_processes}) or set split_batches=False."
        )


def _sampling_kwargs(
    dataloader: DataLoader, use_seedable_sampler: bool = False, data_seed: int | None = None
) -> DataLoaderKwargs:
    if dataloader.batch_sampler is not None and not isinstance(dataloader.dataset, IterableDataset):
        # Only the main process reads: it shuffles as one process does (the reference's order).
        batch_sampler, _ = _prepare_sampling(dataloader.batch_sampler, use_seedable_sampler, data_seed, 1)
        return {"batch_sampler": batch_sampler}
    if isinstance(dataloader.dataset, IterableDataset):
        return {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
    return {"batch_size": None, "sampler": dataloader.sampler}


class _Shardable(Protocol):
    """A Hugging Face streaming dataset: split into file shards, each process can read its own."""

    def shard(self, num_shards: int, index: int) -> Dataset[object]: ...


def _has_shards_for(dataset: object, num_processes: int) -> TypeGuard[_Shardable]:
    """Whether ``dataset`` is a Hugging Face ``IterableDataset`` with at least one shard per process."""
    if type(dataset).__module__.split(".")[0] != "datasets":
        return False
    shards = getattr(dataset, "n_shards", None)
    return isinstance(shards, int) and shards >= num_processes


def _splits_by_worker(dataset: object) -> bool:
    """Whether the dataset already gives each loader worker its own part (Hugging Face datasets do)."""
    if getattr(dataset, "splits_by_worker", False):
        return True
    return type(dataset).__module__.split(".")[0] == "datasets"


def _shard_iterable(
    dataloader: DataLoader, num_processes: int, process_index: int, split_batches: bool, even_batches: bool
) -> LoaderArgs:
    dataset, size = dataloader.dataset, dataloader.batch_size
    if num_processes == 1:
        return {"dataset": dataset, "batch_size": size, "drop_last": dataloader.drop_last}
    if not split_batches and _has_shards_for(dataset, num_processes):
        # A Hugging Face streaming dataset with a file shard (or more) per process: each process reads
        # only its own contiguous run of shards, as the reference library does.
        own = dataset.shard(num_shards=num_processes, index=process_index)
        return {"dataset": own, "batch_size": size, "drop_last": dataloader.drop_last}
    assert isinstance(dataset, IterableDataset)  # only iterable data is sharded here
    shard = IterableDatasetShard(
        dataset,
        batch_size=size or 1,
        drop_last=dataloader.drop_last,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
        even_batches=even_batches,
    )
    shard.split_by_worker = not _splits_by_worker(dataset)
    per_process = None if size is None else shard.process_batch_size
    return {"dataset": shard, "batch_size": per_process, "drop_last": dataloader.drop_last}


def _shard_map_style(
    dataloader: DataLoader,
    num_processes: int,
    process_index: int,
    split_batches: bool,
    even_batches: bool,
    use_seedable_sampler: bool,
    data_seed: int | None,
) -> tuple[LoaderArgs, torch.Generator | None]:
    dataset = dataloader.dataset
    batch_sampler = dataloader.batch_sampler
    sampler_is_batch_sampler = batch_sampler is None and isinstance(dataloader.sampler, BatchSampler)
    if sampler_is_batch_sampler:
        batch_sampler = dataloader.sampler
    if batch_sampler is None:
        if num_processes > 1:
            raise ValueError(
                "This DataLoader does not batch (batch_size=None), so it cannot be sharded between "
                f"{num_processes} processes; give it a batch_size, or a batch sampler."
            )
        return {"dataset": dataset, "batch_size": None, "sampler": dataloader.sampler}, None
    batch_sampler, generator = _prepare_sampling(
        batch_sampler, use_seedable_sampler, data_seed, num_processes
    )
    if isinstance(getattr(batch_sampler, "sampler", None), DistributedSampler) and num_processes > 1:
        # Sharding an already sharded sampler again would give each process 1/n of its 1/n.
        logger.warning(
            "The DataLoader already uses a DistributedSampler; it is kept as the only sharding. Remove it "
            "and let prepare_data_loader shard the data to get even_batches and exact resume."
        )
        num_processes, process_index = 1, 0
    shard = BatchSamplerShard(
        batch_sampler,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
        even_batches=even_batches,
    )
    if sampler_is_batch_sampler:
        return {"dataset": dataset, "batch_size": None, "sampler": shard}, generator
    return {"dataset": dataset, "batch_sampler": shard}, generator


class SkipBatchSampler(BatchSampler):
    """A batch sampler that leaves out the first ``skip_batches`` batches of every iteration.

    The skipped batches are never materialised when the wrapped sampler is a ``BatchSampler`` over a
    sequential or seeded sampler (O(1)); otherwise only their indices are drawn, no data is loaded.

    Args:
        batch_sampler: The batch sampler to skip into.
        skip_batches: Number of batches to leave out.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = int(skip_batches)
        self.sampler = getattr(batch_sampler, "sampler", None)
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        self._view = BatchSamplerShard(batch_sampler, num_processes=1, process_index=0)

    @property
    def total_length(self) -> int:
        """Number of batches of the wrapped sampler, skipped ones included."""
        return len(cast("Sized", self.batch_sampler))  # a batch sampler with a length, as BatchSampler

    def __iter__(self) -> Iterator[list[int]]:
        return self._view._iter_from(self.skip_batches)

    def __len__(self) -> int:
        return max(len(cast("Sized", self.batch_sampler)) - self.skip_batches, 0)


class SkipDataLoader(DataLoaderStateMixin, DataLoader):
    """A ``DataLoader`` that reads and drops its first ``skip_batches`` batches (iterable data).

    While it runs it is ``GradientState``'s active loader, with ``end_of_dataloader`` set as its
    last batch is given out.

    Args:
        dataset: The dataset.
        skip_batches: Batches to drop at the start of every iteration.
        use_stateful_dataloader: Build it on torchdata's ``StatefulDataLoader`` (when installed).
        **kwargs: Everything ``torch.utils.data.DataLoader`` accepts.
    """

    def __init__(
        self,
        dataset: Dataset[object],
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        **kwargs: Unpack[DataLoaderKwargs],
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.skip_batches = int(skip_batches)
        self.use_stateful_dataloader = bool(use_stateful_dataloader)

    def __iter__(self) -> Iterator[object]:
        self.begin()
        # With torchdata underneath, the state as of the batch given out (before the one read ahead to
        # see the end), so that a resume continues right after it, as torchdata's own loader does.
        save = getattr(super(), "state_dict", None)
        save = save if callable(save) else None
        try:
            iterator = super().__iter__()
            _consume(iterator, self.skip_batches)
            current = next(iterator, _END)
            while current is not _END:
                given_out = save() if save is not None else None
                upcoming = next(iterator, _END)
                if upcoming is _END:
                    self.end_of_dataloader = True
                self._state_given_out = given_out
                yield current
                current = upcoming
            self._state_given_out = None
        finally:
            self.end()

    def state_dict(self) -> dict[str, object]:
        """The torchdata loader state as of the last batch given out (``use_stateful_dataloader`` only).

        Raises:
            AttributeError: The loader was built without ``use_stateful_dataloader`` (no state).
        """
        held = self.__dict__.get("_state_given_out")
        return held if held is not None else super().state_dict()  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """Restore a torchdata loader state (``use_stateful_dataloader`` only).

        Raises:
            AttributeError: The loader was built without ``use_stateful_dataloader``.
        """
        self._state_given_out = None
        super().load_state_dict(state_dict)  # type: ignore[misc]

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """Return a loader that starts ``num_batches`` batches into the current epoch of ``dataloader``.

    For map-style data the skip happens at the sampler level: skipped samples are never loaded. A
    prepared loader's copy keeps every setting and shares the original's progress, so after the
    resumed epoch the original continues with the next epoch; the skip applies to the copy's first
    iteration. Iterable data can only be skipped by reading it.

    After ``load_state`` of a checkpoint saved on another number of processes (or batch size), the
    saved position is a number of samples of the epoch's global order, which may not fill whole
    batches of this loader: ``num_batches`` equal to ``resume_point(accelerator).batches_to_skip``
    (that position in this loader's batches, rounded down) then starts at the exact sample, so
    that all processes together continue the saved run's order without skipping or repeating a
    sample; any other count skips that many batches from the start of the epoch.

    Args:
        dataloader: A prepared or plain ``DataLoader``.
        num_batches: Number of batches (of this process) already consumed.

    Returns:
        The loader to iterate for the rest of the epoch.

    Raises:
        ValueError: When ``num_batches`` is negative or not an integer.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from accelerando import skip_first_batches
        >>> loader = DataLoader(list(range(10)), batch_size=2)
        >>> [batch.tolist() for batch in skip_first_batches(loader, num_batches=3)]  # resume mid-epoch
        [[6, 7], [8, 9]]
    """
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise ValueError(f"num_batches must be a non-negative integer, got {num_batches!r}.")
    if isinstance(dataloader, (DataLoaderShard, DataLoaderDispatcher)):
        return dataloader._clone(num_batches)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches needs a DataLoader, got {type(dataloader).__name__}.")
    kwargs = _loader_kwargs(dataloader)
    dataset = dataloader.dataset
    if not isinstance(dataset, IterableDataset) and dataloader.batch_sampler is not None:
        return DataLoader(
            dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches), **kwargs
        )
    sampling: DataLoaderKwargs = {**_sampling_kwargs(dataloader), **kwargs}
    return SkipDataLoader(dataset, skip_batches=num_batches, **sampling)
