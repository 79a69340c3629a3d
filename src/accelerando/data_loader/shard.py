"""DataLoaderShard: a ``DataLoader`` over this process's shard that keeps GradientState informed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from accelerando.core.gradient_state import GradientState
from accelerando.data_loader.adapter import with_stateful_base
from accelerando.data_loader.batches import resolve_send_to_device
from accelerando.data_loader.progress import PreparedLoaderMixin
from accelerando.data_loader.samplers import BatchSamplerShard, _consume

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data import Dataset
    from typing_extensions import Unpack

    from accelerando.data_loader._typing import DataLoaderKwargs, RngTypes, ShardArgs

__all__ = ["DataLoaderShard", "with_stateful_base"]

_END = object()


def _wrap_batch_sampler(dataset: object, kwargs: DataLoaderKwargs) -> None:
    """Give a map-style loader a ``BatchSamplerShard`` so that it can start an epoch anywhere."""
    if isinstance(dataset, IterableDataset):
        return
    batch_sampler = kwargs.get("batch_sampler")
    if batch_sampler is None:
        batch_size = kwargs.pop("batch_size", 1)
        if batch_size is None:
            kwargs["batch_size"] = None
            return
        sampler = kwargs.pop("sampler", None)
        if sampler is None:
            shuffle = kwargs.pop("shuffle", None)
            # A map-style dataset has a length (what DataLoader's own samplers rely on too).
            sized = cast("Sized", dataset)
            sampler = (
                RandomSampler(sized, generator=kwargs.get("generator"))
                if shuffle
                else SequentialSampler(sized)
            )
        kwargs.pop("shuffle", None)
        # A batching loader's sampler gives indices.
        indices = cast("Iterable[int]", sampler)
        batch_sampler = BatchSampler(indices, batch_size, bool(kwargs.pop("drop_last", False)))
    if not isinstance(batch_sampler, BatchSamplerShard):
        batch_sampler = BatchSamplerShard(batch_sampler, num_processes=1, process_index=0)
    kwargs["batch_sampler"] = batch_sampler


class _CudaPrefetch:
    """Copies a batch to the GPU on a side stream; ``ready`` makes the compute stream wait for it.

    Each copy records an event, so that waiting for one batch does not also wait for the copy of
    the next one, which is already under way while the current batch is used.
    """

    def __init__(self, device: torch.device, send: Callable[..., object]) -> None:
        self.device = device
        self.send = send
        self.stream = torch.cuda.Stream(device=device)

    def __call__(self, batch: object) -> tuple[object, torch.cuda.Event]:
        with torch.cuda.stream(self.stream):
            moved = self.send(batch, self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        return moved, copied

    def ready(self, pending: tuple[object, torch.cuda.Event]) -> object:
        batch, copied = pending
        current = torch.cuda.current_stream(self.device)
        current.wait_event(copied)
        _record_stream(batch, current)
        return batch


def _record_stream(batch: object, stream: torch.cuda.Stream) -> None:
    # The copies were allocated on the side stream; tell the allocator the compute stream uses them.
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            _record_stream(value, stream)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _record_stream(value, stream)


class _StatefulIterator(Protocol):
    """The iterator of torchdata's ``StatefulDataLoader``: batches, and the state as of the last one."""

    def __iter__(self) -> Iterator[object]: ...

    def __next__(self) -> object: ...

    def state_dict(self) -> dict[str, object]: ...


class _StatefulBase(Protocol):
    """torchdata's ``StatefulDataLoader`` class, whose methods are called on a loader that derives from it."""

    def load_state_dict(self, loader: DataLoader, state_dict: dict[str, object], /) -> None: ...

    def __iter__(self, loader: DataLoader, /) -> _StatefulIterator: ...


def _stateful_base(cls: type) -> _StatefulBase | None:
    """The torchdata ``StatefulDataLoader`` when ``cls`` derives from it, else None."""
    for base in cls.__mro__:
        if base.__name__ == "StatefulDataLoader" and base.__module__.startswith("torchdata"):
            # Found by name, so torchdata is not imported here; its methods take the loader as self.
            return cast("_StatefulBase", base)
    return None


def _in_flight(item: object) -> tuple[object, torch.cuda.Event]:
    """``item`` read through a ``_CudaPrefetch``: its ``(batch, copy event)`` pair."""
    assert isinstance(item, tuple)  # what _CudaPrefetch.__call__ returns
    return item


def _batch_of(item: object) -> object:
    """The batch of an ``item`` read through a ``_CudaPrefetch`` (its copy may still be under way)."""
    return _in_flight(item)[0]


class DataLoaderShard(PreparedLoaderMixin, DataLoader):
    """A ``DataLoader`` that yields this process's batches, on its device, and tracks its progress.

    It behaves like the ``DataLoader`` it replaces (``len``, ``dataset``, ``batch_size``, ``sampler``,
    workers, ...) and adds: device placement of every batch; synchronisation of the shuffling
    generator between processes at each epoch; ``end_of_dataloader`` and ``remainder`` for
    ``GradientState`` (the last batch of a map-style dataset is known from the batch count, so no batch
    is read ahead); ``set_epoch``; and ``state_dict`` / ``load_state_dict`` for exact resume.

    Args:
        dataset: The dataset (usually already wrapped by ``prepare_data_loader``).
        device: Where to put batches; None leaves them where the ``DataLoader`` makes them.
        rng_types: Random generators to synchronise from the main process at each epoch.
        synchronized_generator: The generator that shuffles (found on the sampler when None).
        skip_batches: Batches to skip at the start of the first iteration (at the sampler level).
        use_stateful_dataloader: Make ``load_state_dict`` restore the position inside the epoch.
        torch_device_mesh: Accepted for API compatibility; sharding is decided by the caller.
        **kwargs: Everything ``torch.utils.data.DataLoader`` accepts.
    """

    def __init__(
        self,
        dataset: Dataset[object],
        device: torch.device | str | None = None,
        rng_types: RngTypes | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: DeviceMesh | None = None,
        **kwargs: Unpack[DataLoaderKwargs],
    ) -> None:
        _wrap_batch_sampler(dataset, kwargs)
        self._init_args: ShardArgs = {
            "device": device,
            "rng_types": rng_types,
            "synchronized_generator": synchronized_generator,
            "use_stateful_dataloader": use_stateful_dataloader,
            "_drop_last": _drop_last,
            "_non_blocking": _non_blocking,
            "torch_device_mesh": torch_device_mesh,
            **kwargs,
        }
        super().__init__(dataset, **kwargs)
        self.torch_device_mesh = torch_device_mesh
        self._init_prepared(
            device,
            rng_types,
            synchronized_generator,
            skip_batches,
            use_stateful_dataloader,
            _drop_last,
            _non_blocking,
        )

    def __len__(self) -> int:
        return max(super().__len__() - self._skip_once, 0)

    def _clone(self, skip_batches: int) -> DataLoaderShard:
        clone = type(self)(self.dataset, skip_batches=skip_batches, **self._init_args)
        clone._progress = self._progress
        return clone

    def __iter__(self) -> Iterator[object]:
        start = self._start_epoch()
        self.begin()
        completed = False
        try:
            # The batch boundaries (``with_batch_boundaries``'s rule) are reached inline, here and in
            # the iterators below after each batch given out: two generator layers fewer per batch.
            if GradientState._shared_state.get("at_next_batch") is not None:
                GradientState().reach_batch_boundary()
            yield from self._iterate(start)
            completed = True
        finally:
            self.end(completed)

    def _transfer(self) -> Callable[[object], object] | _CudaPrefetch | None:
        device = self.device
        if device is None or device.type == "cpu":
            # Batches come out of the DataLoader on the CPU already: nothing to move.
            return None
        send = resolve_send_to_device()
        if self._non_blocking and device.type == "cuda":
            return _CudaPrefetch(device, send)
        non_blocking = self._non_blocking
        return lambda batch: send(batch, device, non_blocking=non_blocking)

    def _iterate(self, start: int) -> Iterator[object]:
        """This epoch's batches from batch ``start`` (a plain function: no generator layer of its own)."""
        transfer = self._transfer()
        shard = self._shard()
        if shard is None:
            iterator, resumed, capture = self._iterable_iterator()
            if not resumed:
                _consume(iterator, start)  # iterable data without saved state: skipping means reading
            return self._iterate_ahead(iterator, start, transfer, capture)
        if shard.has_length and not isinstance(transfer, _CudaPrefetch):
            total = len(shard)
            return self._iterate_counted(self._base_iterator(shard, start), start, total, transfer)
        return self._iterate_ahead(self._base_iterator(shard, start), start, transfer)

    def _iterable_iterator(self) -> tuple[Iterator[object], bool, Callable[[], dict[str, object]] | None]:
        """The underlying iterator; with torchdata, resumed from a loaded state when there is one."""
        stateful = _stateful_base(type(self))
        if stateful is None:
            with self._stream_window():
                return DataLoader.__iter__(self), False, None
        progress = self._progress
        pending, progress.pending_loader_state = progress.pending_loader_state, None
        if pending is not None:
            stateful.load_state_dict(self, pending)
        with self._first_iterator_rng(0 if pending is None else 1), self._stream_window():
            iterator = stateful.__iter__(self)
        return iterator, pending is not None, iterator.state_dict

    def _base_iterator(self, shard: BatchSamplerShard, start: int) -> Iterator[object]:
        shard._next_start = start
        # Creating a DataLoader iterator without a generator of its own draws a base seed from the
        # global RNG. An epoch resumed mid-way (load_state, then skip_first_batches) had that draw
        # made when the interrupted run entered it, and the restored RNG state already includes it:
        # drawing again would shift every later random number (dropout masks) by one. Skipping
        # without a loaded state draws, as the reference does.
        replaying = self._progress.replaying  # started past the epoch's first batch, from a loaded state
        rng_state = torch.get_rng_state() if replaying and self.generator is None else None
        try:
            with self._first_iterator_rng(start):
                return DataLoader.__iter__(self)
        finally:
            shard._next_start = 0
            if rng_state is not None:
                torch.set_rng_state(rng_state)

    def _iterate_counted(
        self,
        iterator: Iterator[object],
        position: int,
        total: int,
        transfer: Callable[[object], object] | None,
    ) -> Iterator[object]:
        """Give out batches without reading ahead, except past the last one.

        Before the last batch is given out the underlying iterator is read to its end, as a loader
        that always reads ahead would: the sampler's use of its generator is then over, so a
        checkpoint taken after the last step holds the generator as the next epoch starts it.
        """
        progress = self._progress
        shared = GradientState._shared_state  # ``at_next_batch`` is read once per batch: no call
        last = total - 1
        current = next(iterator, _END)
        while current is not _END:
            upcoming: object = _END
            if position >= last:
                upcoming = next(iterator, _END)
                if upcoming is _END:
                    self.end_of_dataloader = True
                    progress.exhausted = True
            if transfer is not None:
                current = transfer(current)
            position += 1
            progress.position = position
            yield current
            if shared.get("at_next_batch") is not None:
                GradientState().reach_batch_boundary()
            current = upcoming if upcoming is not _END or position > last else next(iterator, _END)

    def _iterate_ahead(
        self,
        iterator: Iterator[object],
        position: int,
        transfer: Callable[[object], object] | _CudaPrefetch | None,
        capture: Callable[[], dict[str, object]] | None = None,
    ) -> Iterator[object]:
        """Read one batch ahead: needed to see the end of iterable data, and to overlap copies.

        ``capture`` (torchdata's iterator ``state_dict``) is called before each read-ahead, so the
        saved state describes the batches given out, not the one read in advance.
        """
        progress = self._progress
        shared = GradientState._shared_state
        prefetch = transfer if isinstance(transfer, _CudaPrefetch) else None
        # Map-style data knew its remainder when the iteration began; iterable data learns it here.
        iterable = self._shard() is None
        current = next(iterator, _END)
        if current is not _END and transfer is not None:
            current = transfer(current)
        while current is not _END:
            if capture is not None:
                progress.loader_state = capture()
            upcoming = next(iterator, _END)
            if upcoming is _END:
                self.end_of_dataloader = True
                progress.exhausted = True
                if iterable:
                    self.remainder = self._last_remainder(
                        _batch_of(current) if prefetch is not None else current
                    )
            elif transfer is not None:
                upcoming = transfer(upcoming)
            position += 1
            progress.position = position
            yield prefetch.ready(_in_flight(current)) if prefetch is not None else current
            if shared.get("at_next_batch") is not None:
                GradientState().reach_batch_boundary()
            current = upcoming
