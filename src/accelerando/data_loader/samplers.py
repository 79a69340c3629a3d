"""Samplers that split one epoch's stream of indices (or samples) between processes.

Every process builds the same stream (same sampler, same seed, same epoch) and keeps its own part, so
no communication is needed: ``BatchSamplerShard`` for map-style datasets, ``IterableDatasetShard`` for
iterable ones. Both can start an epoch at a given position without loading the skipped samples
(``_next_start``, set by the prepared loader right before it iterates), which is how exact mid-epoch
resume and ``skip_first_batches`` work.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, TypeVar, cast

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, Sampler, SequentialSampler

from accelerando.data_loader.batches import like_sample, to_plain

__all__ = ["BatchSamplerShard", "EpochWindow", "IterableDatasetShard", "SeedableRandomSampler"]


_T = TypeVar("_T")


class _SetsEpoch(Protocol):
    """An object with ``set_epoch(epoch)``: a seeded sampler, a batch sampler or a dataset."""

    def set_epoch(self, epoch: int, /) -> object: ...


def _has_set_epoch(obj: object) -> TypeGuard[_SetsEpoch]:
    """Whether ``obj`` has a ``set_epoch`` (samplers, batch samplers and datasets may)."""
    return hasattr(obj, "set_epoch")


def _consume(iterator: Iterator[object], count: int) -> None:
    """Advance ``iterator`` by ``count`` items at C speed (no Python-level loop per item)."""
    if count > 0:
        next(itertools.islice(iterator, count, count), None)


def _cycle_to(items: list[_T], count: int) -> list[_T]:
    """Return the first ``count`` items of ``items`` repeated as often as needed."""
    if count <= 0 or not items:
        return []
    repeats = -(-count // len(items))
    return (items * repeats)[:count]


def _tensor_iter(indices: torch.Tensor) -> Iterator[int]:
    """Iterate a 1-D index tensor at C speed, converting it to Python ints piecewise.

    Piecewise, because a list of every index of a large dataset costs tens of bytes per index; and
    without a Python generator per index, so skipping another process's indices is cheap.
    """
    return itertools.chain.from_iterable(chunk.tolist() for chunk in indices.split(1 << 16))


class _DrawnRandomSampler(RandomSampler):
    """A ``RandomSampler`` over a generator that prepared loaders own (several processes).

    The order is drawn exactly as ``RandomSampler`` draws it from its generator (so it matches the
    reference library's sharded order for the same seed); the class only marks the generator as one
    that nothing but this sampler draws from, which lets the loader skip re-synchronising it.
    """

    _owned_generator = True


class _GlobalDrawRandomSampler(RandomSampler):
    """A ``RandomSampler`` without a generator that remembers the seed each epoch drew.

    Like ``RandomSampler``, each iteration draws one seed from the global torch generator when it
    starts and shuffles with a generator seeded from it, so a single process sees exactly plain
    PyTorch's order for the same ``set_seed``. The drawn seed is kept in ``epoch_seed`` so that a
    checkpoint taken inside the epoch can replay its order; ``pending_seed`` (set by a loaded state)
    is used once instead of drawing.
    """

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples)
        self.epoch_seed: int | None = None
        self.pending_seed: int | None = None
        # An order saved by several processes (their shuffling generator's state at the epoch's start),
        # replayed once instead of a seed; ``epoch_state`` keeps it for a checkpoint inside that epoch.
        self.epoch_state: torch.Tensor | None = None
        self.pending_state: torch.Tensor | None = None

    def __iter__(self) -> Iterator[int]:
        seed, self.pending_seed = self.pending_seed, None
        state, self.pending_state = self.pending_state, None
        generator = torch.Generator()
        if state is not None:
            generator.set_state(state)
        else:
            if seed is None:
                seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator.manual_seed(seed)
        self.epoch_seed, self.epoch_state = seed if state is None else None, state
        self.generator = generator
        try:
            yield from RandomSampler.__iter__(self)
        finally:
            self.generator = None


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends only on ``(seed, epoch)``.

    Every process that builds it with the same seed gets the same permutation, so it needs no
    synchronisation; ``set_epoch`` changes the permutation from one epoch to the next, and finishing
    an iteration moves to the next epoch by itself (call ``set_epoch`` to choose one explicitly).

    Args:
        data_source: The dataset (anything with ``len``).
        replacement: Draw with replacement.
        num_samples: Number of indices per epoch (default: ``len(data_source)``).
        generator: Kept for compatibility with ``RandomSampler``; the order never depends on it.
        data_seed: The seed; default ``torch.initial_seed()`` of this process (call ``set_seed`` so
            that every process agrees, or pass ``data_seed``).

    Example:
        >>> sampler = SeedableRandomSampler(range(4), data_seed=0)
        >>> sorted(sampler)
        [0, 1, 2, 3]
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        self.initial_seed = int(data_seed) if data_seed is not None else int(torch.initial_seed())
        self.epoch = 0
        self._cache: tuple[tuple[int, int, int], torch.Tensor] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration yields.

        Args:
            epoch: The epoch number (any non-negative integer).
        """
        self.epoch = int(epoch)

    def _indices(self) -> torch.Tensor:
        total, size = self.num_samples, len(self.data_source)  # type: ignore[arg-type]
        key = (self.initial_seed + self.epoch, total, size)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        gen = torch.Generator()
        gen.manual_seed(key[0])
        if self.replacement:
            indices = torch.randint(size, (total,), generator=gen, dtype=torch.int64)
        elif size == 0:
            indices = torch.empty(0, dtype=torch.int64)
        else:
            parts = [torch.randperm(size, generator=gen) for _ in range(-(-total // size))]
            indices = torch.cat(parts)[:total] if parts else torch.empty(0, dtype=torch.int64)
        self._cache = (key, indices)
        return indices

    def _iter_from(self, start: int) -> Iterator[int]:
        """Iterate this epoch's indices from position ``start`` (O(1) skip; the epoch stays)."""
        return _tensor_iter(self._indices()[start:])

    def __iter__(self) -> Iterator[int]:
        yield from self._iter_from(0)
        self._cache = None
        self.epoch += 1

    def __len__(self) -> int:
        return self.num_samples


def _iter_sampler_from(sampler: Iterable[int], start: int) -> Iterator[int]:
    """Iterate ``sampler`` from position ``start``, skipping in O(1) when the sampler allows it."""
    fast = getattr(sampler, "_iter_from", None)
    if fast is not None:
        return fast(start)
    if type(sampler) is SequentialSampler:
        return iter(range(start, len(sampler)))
    iterator = iter(sampler)
    _consume(iterator, start)
    return iterator


@dataclass(frozen=True)
class EpochWindow:
    """The part of one epoch's global order that an epoch resumed on another layout gives out.

    Set by a prepared loader on its ``BatchSamplerShard`` or ``IterableDatasetShard`` for that one
    epoch (see :mod:`accelerando.data_loader.global_position`); the next epoch is a whole one again.

    Attributes:
        offset: Units of the order already consumed (indices; whole batches of a user's batch
            sampler), dropped before batching and sharding.
        end: Where the saved run's epoch stopped, in the same units (None: the order's own end).
        stride: Keep only whole groups of this many units past ``offset`` (``drop_last`` with a stream
            of unknown length: the saved run's global batch).
        pad: Complete the last global batch from the resumed epoch's first samples, as ``even_batches``
            does (also with ``drop_last``, so that every batch keeps its full size).
    """

    offset: int
    end: int | None = None
    stride: int | None = None
    pad: bool = True

    def cut(self, items: Iterator[_T], skipped: bool = False) -> Iterator[_T]:
        """The window of ``items``: past ``offset`` (unless ``skipped`` already), up to ``end``, whole strides.

        Args:
            items: The epoch's units in order, from the start (or from ``offset`` when ``skipped``).
            skipped: ``items`` starts at ``offset`` already.
        """
        if not skipped:
            _consume(items, self.offset)
        if self.end is not None:
            items = itertools.islice(items, max(self.end - self.offset, 0))
        if self.stride:
            return _whole_groups(items, self.stride)
        return items

    def count(self, total: int) -> int:
        """Units the window gives out of an order of ``total`` units."""
        stop = total if self.end is None else min(self.end, total)
        left = max(stop - self.offset, 0)
        return left - left % self.stride if self.stride else left


def _whole_groups(items: Iterator[_T], size: int) -> Iterator[_T]:
    """``items`` in groups of ``size``, leaving out a last group that is not whole."""
    while True:
        group = list(itertools.islice(items, size))
        if len(group) < size:
            return
        yield from group


class _IndexWindow(Sampler[int]):
    """An index sampler's epoch, cut to an ``EpochWindow`` (skipped indices are not drawn one by one
    for sequential and seeded samplers).
    """

    def __init__(self, sampler: Iterable[int], window: EpochWindow) -> None:
        self.sampler = sampler
        self.window = window

    def __iter__(self) -> Iterator[int]:
        return self.window.cut(_iter_sampler_from(self.sampler, self.window.offset), skipped=True)

    def __len__(self) -> int:
        return self.window.count(len(cast("Sized", self.sampler)))


class _BatchWindow:
    """A user's batch sampler's epoch, cut to an ``EpochWindow`` counted in whole batches."""

    def __init__(self, batch_sampler: Iterable[list[int]], window: EpochWindow) -> None:
        self.batch_sampler = batch_sampler
        self.window = window
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.sampler = getattr(batch_sampler, "sampler", None)

    def __iter__(self) -> Iterator[list[int]]:
        return self.window.cut(iter(self.batch_sampler))

    def __len__(self) -> int:
        return self.window.count(len(cast("Sized", self.batch_sampler)))


class _WindowedStream(IterableDataset):
    """An iterable dataset read through an ``EpochWindow`` (one process, or the dispatcher's reader)."""

    def __init__(self, dataset: Iterable[object], window: EpochWindow) -> None:
        self.dataset = dataset
        self.window = window

    def __iter__(self) -> Iterator[object]:
        return self.window.cut(iter(self.dataset))


class _EpochStream:
    """One epoch of batches from a batch sampler, from a start batch, plus the epoch's first indices.

    ``head`` (the first ``head_size`` indices of the epoch) is what padding cycles through; it is
    taken from the same pass as the batches so that samplers drawing a fresh order per ``iter()``
    stay consistent.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], start_batch: int, head_batches: int) -> None:
        self.head: list[int] = []
        self.head_batches: list[list[int]] = []
        if type(batch_sampler) is BatchSampler:
            self.batches = self._from_indices(batch_sampler, start_batch, head_batches)
        else:
            self.batches = self._from_batches(batch_sampler, start_batch, head_batches)

    def _from_indices(self, sampler: BatchSampler, start: int, head_batches: int) -> Iterator[list[int]]:
        size = sampler.batch_size
        head_size, start_index = head_batches * size, start * size
        inner = sampler.sampler
        if isinstance(inner, SeedableRandomSampler) or type(inner) is SequentialSampler:
            # Deterministic samplers: read the head separately, then jump straight to the start.
            self.head = list(itertools.islice(_iter_sampler_from(inner, 0), head_size))
            if start_index >= len(self.head):
                indices = _iter_sampler_from(inner, start_index)
            else:
                indices = itertools.chain(self.head[start_index:], _iter_sampler_from(inner, len(self.head)))
            # These samplers give exactly len() indices: their batches are grouped in C.
            return self._chunk_known(indices, size, len(inner) - start_index, sampler.drop_last)
        else:
            indices = iter(inner)
            self.head = list(itertools.islice(indices, head_size))
            if start_index <= head_size:
                indices = itertools.chain(self.head[start_index:], indices)
            else:
                _consume(indices, start_index - head_size)
        return self._chunk(indices, size, sampler.drop_last)

    @staticmethod
    def _chunk_known(indices: Iterator[int], size: int, count: int, drop_last: bool) -> Iterator[list[int]]:
        """Batches of ``size`` from a stream of exactly ``count`` indices, without a Python frame per batch.

        ``zip`` over ``size`` references to one iterator takes ``size`` indices per tuple (in C); only
        the short last batch, if kept, comes from a generator.
        """
        full, rest = divmod(max(count, 0), size)
        # strict=False: islice stops after the full batches, before zip could see the end.
        grouped = zip(*[indices] * size, strict=False)
        batches: Iterator[list[int]] = map(list, itertools.islice(grouped, full))
        if rest and not drop_last:
            return itertools.chain(batches, _EpochStream._chunk(indices, size, drop_last))
        return batches

    @staticmethod
    def _chunk(indices: Iterator[int], size: int, drop_last: bool) -> Iterator[list[int]]:
        while True:
            batch = list(itertools.islice(indices, size))
            if len(batch) < size and (drop_last or not batch):
                return
            yield batch

    def _from_batches(
        self, sampler: Iterable[list[int]], start: int, head_batches: int
    ) -> Iterator[list[int]]:
        iterator = iter(sampler)
        first = list(itertools.islice(iterator, head_batches))
        self.head_batches = first
        self.head = [index for batch in first for index in batch]
        if start <= len(first):
            return itertools.chain(first[start:], iterator)
        _consume(iterator, start - len(first))
        return iterator


class BatchSamplerShard(BatchSampler):
    """Give each process its share of the batches of a batch sampler.

    Without ``split_batches``, process ``i`` takes batches ``i, i + n, i + 2n, ...`` (``n`` processes);
    with it, every batch is cut into ``n`` equal slices and process ``i`` takes slice ``i``. With
    ``even_batches`` (and a batch sampler that keeps its last short batch), the final global batch is
    completed with indices from the start of the epoch so that every process gets the same number of
    full batches; ``remainder`` then says how many indices of that final global batch are real.

    Args:
        batch_sampler: The batch sampler to shard (a ``BatchSampler`` or any iterable of index lists).
        num_processes: Number of processes sharing the data.
        process_index: This process's index in ``[0, num_processes)``.
        split_batches: Slice each batch between processes instead of dealing whole batches.
        even_batches: Pad the final global batch so every process gets the same number of batches.

    Raises:
        ValueError: On an index out of range, or ``split_batches`` with a batch size that the number
            of processes does not divide (or a batch sampler without ``batch_size``).

    Example:
        >>> shard = BatchSamplerShard(BatchSampler(range(10), 2, False), num_processes=2, process_index=1)
        >>> list(shard)
        [[2, 3], [6, 7], [0, 1]]
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        _check_process(num_processes, process_index)
        self.batch_sampler = batch_sampler
        self.num_processes = int(num_processes)
        self.process_index = int(process_index)
        self.split_batches = bool(split_batches)
        self.even_batches = bool(even_batches)
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        self.sampler = getattr(batch_sampler, "sampler", None)
        self._next_start = 0
        # Set by a prepared loader for an epoch resumed on another layout (a global position).
        self.window: EpochWindow | None = None
        if self.split_batches:
            if self.batch_size is None:
                raise ValueError(
                    "split_batches=True needs a batch sampler with a `batch_size` attribute; give your "
                    "batch sampler one or set split_batches=False."
                )
            if self.batch_size % self.num_processes != 0:
                raise ValueError(
                    f"split_batches=True needs a batch size that is a round multiple of the number of "
                    f"processes, got batch size {self.batch_size} for {self.num_processes} processes; use a "
                    f"batch size that is a multiple of {self.num_processes} or set split_batches=False."
                )

    @property
    def total_length(self) -> int | None:
        """Number of indices the wrapped batch sampler yields per epoch, when it can be known."""
        if type(self.batch_sampler) is BatchSampler:
            sampler = self.batch_sampler.sampler
            if isinstance(sampler, Sized):
                total = len(sampler)
                if self.drop_last and self.batch_size:
                    total -= total % self.batch_size
                return total
        return None

    @property
    def global_batch_size(self) -> int | None:
        """Number of indices in one global batch (all processes together)."""
        if self.batch_size is None:
            return None
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def remainder(self) -> int:
        """Real indices in the final, padded global batch; -1 when no padding is added."""
        total, gbs = self.total_length, self.global_batch_size
        if self.num_processes == 1 or total is None or not gbs or self.drop_last or not self.even_batches:
            return -1
        return -1 if total % gbs == 0 else total % gbs

    @property
    def has_length(self) -> bool:
        """Whether the wrapped batch sampler has a length (so this one has too)."""
        return isinstance(self.batch_sampler, Sized)

    def _windowed(self, window: EpochWindow) -> BatchSamplerShard:
        """A copy of this shard over ``window`` of the epoch: the remaining units, batched and dealt
        as usual; its tail is kept (padded when ``window.pad``) rather than dropped.
        """
        view = copy.copy(self)
        view.window = None
        inner = self.batch_sampler
        if type(inner) is BatchSampler:
            # Plain BatchSampler: exact, it only needs an index sampler (checked when it was built).
            indices = _IndexWindow(cast("Iterable[int]", inner.sampler), window)
            view.batch_sampler = BatchSampler(indices, inner.batch_size, False)
        else:
            view.batch_sampler = _BatchWindow(inner, window)
        view.drop_last, view.even_batches = False, window.pad
        return view

    def __len__(self) -> int:
        if self.window is not None:
            return len(self._windowed(self.window))
        if not self.has_length:
            raise TypeError(
                f"{type(self.batch_sampler).__name__} has no __len__, so the number of batches per process "
                "is unknown; give the batch sampler a __len__ (or avoid len() on the prepared loader)."
            )
        batches = len(self.batch_sampler)  # type: ignore[arg-type]
        n, p = self.num_processes, self.process_index
        if n == 1:
            return batches
        if self.split_batches:
            total = self.total_length
            if self.even_batches or self.drop_last or total is None or self.batch_size is None:
                return batches
            short = total % self.batch_size
            return batches if short == 0 or short > p * (self.batch_size // n) else batches - 1
        full, extra = divmod(batches, n)
        if extra == 0 or self.drop_last:
            return full
        return full + 1 if self.even_batches or p < extra else full

    def _iter_from(self, start: int) -> Iterator[list[int]]:
        """Iterate this process's batches of the epoch, starting at its batch number ``start``.

        A plain function returning one of the generators below (each starts reading the sampler only
        when asked for its first batch): one generator layer fewer per batch.
        """
        if self.window is not None:
            return self._windowed(self.window)._iter_from(start)
        if self.num_processes == 1:
            return self._iter_single(start)
        if self.split_batches:
            return self._iter_split(start)
        return self._iter_dealt(start)

    def _iter_single(self, start: int) -> Iterator[list[int]]:
        yield from _EpochStream(self.batch_sampler, start, 0).batches

    def __iter__(self) -> Iterator[list[int]]:
        # The loader sets ``_next_start`` around creating its iterator (which may call iter() twice).
        return self._iter_from(self._next_start)

    def _iter_split(self, start: int) -> Iterator[list[int]]:
        size = self.batch_size or 0
        width = size // self.num_processes
        lo, hi = width * self.process_index, width * (self.process_index + 1)
        stream = _EpochStream(self.batch_sampler, start, 1)
        last: list[int] = []
        for batch in stream.batches:
            if len(batch) != size:
                last = batch
                break
            yield batch[lo:hi]
        if not last or self.drop_last:
            return
        if self.even_batches:
            last = last + _cycle_to(stream.head, size - len(last))
        if last[lo:hi]:
            yield last[lo:hi]

    def _iter_dealt(self, start: int) -> Iterator[list[int]]:
        n, p, size = self.num_processes, self.process_index, self.batch_size
        stream = _EpochStream(self.batch_sampler, start * n, n)
        pending: list[list[int]] = []
        for batch in stream.batches:
            pending.append(batch)
            if len(pending) == n:
                if size is not None and len(batch) != size:
                    break
                yield pending[p]
                pending = []
        if not pending or self.drop_last:
            return
        if not self.even_batches:
            if p < len(pending):
                yield pending[p]
            return
        if size is None:
            # Batches of unknown size: complete the round with whole batches from the epoch start.
            yield (pending + _cycle_to(stream.head_batches, n - len(pending)))[p]
            return
        real = [index for batch in pending for index in batch]
        padded = real + _cycle_to(stream.head, n * size - len(real))
        yield padded[p * size : (p + 1) * size]


def _check_process(num_processes: int, process_index: int) -> None:
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a positive integer, got {num_processes!r}.")
    if not isinstance(process_index, int) or not 0 <= process_index < num_processes:
        raise ValueError(
            f"process_index must be in [0, {num_processes}), got {process_index!r}; pass this process's rank."
        )


class IterableDatasetShard(IterableDataset):
    """Give each process its slice of every global batch of an iterable dataset.

    Every process reads the whole stream and groups it into global batches of
    ``batch_size * num_processes`` samples (``batch_size`` with ``split_batches``); process ``i``
    keeps the ``i``-th slice of each. The last, short global batch is dropped with ``drop_last``,
    completed with the first samples of the stream with ``even_batches``, or otherwise split as is.
    When the loader uses worker processes, worker ``w`` of ``W`` keeps global batches
    ``w, w + W, ...``, so the loader's round-robin over workers gives back the stream's order.

    Args:
        dataset: The iterable dataset.
        batch_size: Per-process batch size (the global batch size with ``split_batches``).
        drop_last: Drop the final incomplete global batch.
        num_processes: Number of processes.
        process_index: This process's index.
        split_batches: Treat ``batch_size`` as the global batch size.
        even_batches: Pad the final global batch with samples from the start of the stream.

    Attributes:
        last_remainder: After an iteration in this process, the number of real samples in the last
            global batch given out (the global batch size when the stream ended on a full batch or
            its short tail was dropped); -1 before any.

    Raises:
        ValueError: On an index out of range or a ``batch_size`` the processes cannot split.
    """

    def __init__(
        self,
        dataset: Iterable[object],
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        _check_process(num_processes, process_index)
        if split_batches and batch_size % num_processes != 0:
            raise ValueError(
                f"split_batches=True needs a batch size that is a round multiple of the number of "
                f"processes, got {batch_size} for {num_processes} processes; use a multiple of {num_processes}."
            )
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.num_processes = int(num_processes)
        self.process_index = int(process_index)
        self.split_batches = bool(split_batches)
        self.even_batches = bool(even_batches)
        self.epoch = 0
        self.last_remainder = -1
        self.split_by_worker = True
        self._batches = 0
        self._first: list[object] | None = None
        # A state restored from a checkpoint: untyped data read back from disk.
        self._resume: dict[str, Any] | None = None
        # Set by a prepared loader for an epoch resumed on another layout (a global position).
        self.window: EpochWindow | None = None

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch and forward it to the dataset when it has ``set_epoch``.

        Args:
            epoch: The epoch number.
        """
        self.epoch = epoch
        dataset = self.dataset
        if _has_set_epoch(dataset):
            dataset.set_epoch(epoch)

    @property
    def global_batch_size(self) -> int:
        """Samples per global batch."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        """Samples each process takes from one global batch."""
        return self.global_batch_size // self.num_processes

    def __len__(self) -> int:
        total = len(self.dataset)  # type: ignore[arg-type]
        gbs, width = self.global_batch_size, self.process_batch_size
        if self.drop_last:
            return (total // gbs) * width
        if self.even_batches:
            return math.ceil(total / gbs) * width
        full, extra = divmod(total, gbs)
        return full * width + min(max(extra - self.process_index * width, 0), width)

    def state_dict(self) -> dict[str, object]:
        """Where the current pass over the stream stands (used by torchdata's ``StatefulDataLoader``).

        The first global batch is stored as plain data (see :func:`~accelerando.data_loader.batches.
        to_plain`) so that the state loads with ``torch.load(weights_only=True)``: a mapping sample
        (a transformers ``BatchEncoding``...) or a dataclass is stored as a ``dict``, a namedtuple as a
        ``tuple``. A sample holding other Python objects is stored as it is, and the state then needs
        the ``load_kwargs={"weights_only": False}`` opt-in to load.

        Returns:
            ``batches`` (global batches read so far), ``first`` (the first global batch, kept for
            padding) and, when the wrapped dataset has ``state_dict``, its ``dataset`` state.
        """
        first = None if self._first is None else [to_plain(sample) for sample in self._first]
        state: dict[str, object] = {"batches": self._batches, "first": first}
        dataset_state = getattr(self.dataset, "state_dict", None)
        if callable(dataset_state):
            state["dataset"] = dataset_state()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make the next pass continue from ``state_dict`` (from ``state_dict()``).

        Without a ``dataset`` state the next pass reads through the batches already seen, and takes
        the first global batch from the stream again, as the dataset gives it. With one, the stored
        plain first batch is used: a padding sample then gets the container type of the samples the
        stream gives in this run (a mapping or namedtuple type), or stays a plain ``dict`` / ``tuple``
        when that type cannot be built from it.

        Args:
            state_dict: The saved state. A wrapped dataset with ``load_state_dict`` is restored
                directly; otherwise the next pass reads through the batches already seen.
        """
        self._resume = dict(state_dict)
        if "dataset" in state_dict:
            load = getattr(self.dataset, "load_state_dict", None)
            if callable(load):
                load(state_dict["dataset"])

    def _stream(self) -> Iterator[object]:
        resume, self._resume = self._resume, None
        self._batches, self._first = 0, None
        iterator = iter(self.dataset)
        if resume is not None:
            self._batches, self._first = int(resume["batches"]), resume.get("first")
            if "dataset" not in resume and self._batches > 0:
                # The original first batch, rather than its plain copy from the state.
                self._first = list(itertools.islice(iterator, self.global_batch_size))
                _consume(iterator, (self._batches - 1) * self.global_batch_size)
        elif self.window is not None:
            return self.window.cut(iterator)
        return iterator

    def __iter__(self) -> Iterator[object]:
        from torch.utils.data import get_worker_info

        # A dataset that splits itself between workers must not be split again.
        info = get_worker_info()
        split = info is not None and self.split_by_worker
        workers, worker = (info.num_workers, info.id) if info is not None and split else (1, 0)
        gbs, width = self.global_batch_size, self.process_batch_size
        lo, hi = self.process_index * width, (self.process_index + 1) * width
        current: list[object] = []
        self.last_remainder = -1
        # A resumed epoch keeps its tail, padded when asked (see EpochWindow.pad).
        window = self.window
        drop_last = self.drop_last and window is None
        even = self.even_batches if window is None else window.pad
        for sample in self._stream():
            current.append(sample)
            if len(current) == gbs:
                if self._first is None:
                    self._first = current
                # Counted before yielding: a state saved after this slice must include the batch.
                self._batches += 1
                self.last_remainder = gbs
                if (self._batches - 1) % workers == worker:
                    yield from current[lo:hi]
                current = []
        if not current or drop_last or self._batches % workers != worker:
            return
        self.last_remainder = len(current)
        if even and self.num_processes > 1:
            padding = _cycle_to(self._first or current, gbs - len(current))
            current = current + [like_sample(sample, current[0]) for sample in padding]
        yield from current[lo:hi]
