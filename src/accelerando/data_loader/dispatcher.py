"""DataLoaderDispatcher: the main process reads the data and sends every process its slice.

For data that cannot be sharded by index (a stream, a generator, a dataset reading a socket), only
the main process iterates the underlying ``DataLoader``. Each step it takes one global batch (one
batch with ``split_batches``, else ``num_processes`` batches), cuts it into one slice per process and
scatters the slices; the other processes never touch the dataset while iterating.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypedDict

import torch
from torch.utils.data import DataLoader

from accelerando.core.gradient_state import with_batch_boundaries
from accelerando.data_loader.batches import batch_size_of, concat_batches, resolve_send_to_device, slice_batch
from accelerando.data_loader.progress import PreparedLoaderMixin
from accelerando.data_loader.samplers import BatchSamplerShard, _consume
from accelerando.data_loader.scatter import scatter_parts, wait_all
from accelerando.data_loader.shard import _wrap_batch_sampler

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.utils.data import Dataset
    from typing_extensions import Unpack

    from accelerando.data_loader._typing import DataLoaderKwargs, DispatcherArgs, RngTypes
    from accelerando.data_loader.scatter import Message as _Message
    from accelerando.data_loader.scatter import Pending

__all__ = ["DataLoaderDispatcher"]


class _Steps(TypedDict):
    """What the main process remembers across the steps of an epoch."""

    first: object  # the first global batch (padding for the last step), once read
    size: int | None  # the batch size of the first base batch


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class DataLoaderDispatcher(PreparedLoaderMixin, DataLoader):
    """A ``DataLoader`` whose batches are read on the main process and scattered to all processes.

    Args:
        dataset: The dataset (not sharded: the main process reads all of it).
        split_batches: Cut each batch of the underlying loader between processes (else each step
            reads ``num_processes`` batches and every process gets one batch worth of samples).
        skip_batches: Steps to skip at the start of the first iteration.
        use_stateful_dataloader: Make ``load_state_dict`` restore the position inside the epoch.
        slice_fn: ``slice_fn(batch, slice, process_index=..., num_processes=...)`` cutting a batch;
            default: every tensor and leaf list along its first dimension.
        torch_device_mesh: Accepted for API compatibility.
        device: Where to put the received batches (None: leave them on the CPU).
        rng_types: Random generators to synchronise from the main process at each epoch.
        even_batches: Pad the final global batch with samples of the first one so every process gets
            a batch; otherwise processes past the real samples get nothing at the last step.
        **kwargs: Everything ``torch.utils.data.DataLoader`` accepts.
    """

    def __init__(
        self,
        dataset: Dataset[object],
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable[..., object] | None = None,
        torch_device_mesh: DeviceMesh | None = None,
        device: torch.device | str | None = None,
        rng_types: RngTypes | None = None,
        even_batches: bool = True,
        **kwargs: Unpack[DataLoaderKwargs],
    ) -> None:
        _wrap_batch_sampler(dataset, kwargs)
        self._init_args: DispatcherArgs = {
            "split_batches": split_batches,
            "use_stateful_dataloader": use_stateful_dataloader,
            "_drop_last": _drop_last,
            "_non_blocking": _non_blocking,
            "slice_fn": slice_fn,
            "torch_device_mesh": torch_device_mesh,
            "device": device,
            "rng_types": rng_types,
            "even_batches": even_batches,
            **kwargs,
        }
        super().__init__(dataset, **kwargs)
        self.split_batches = bool(split_batches)
        self.even_batches = bool(even_batches)
        self.slice_fn = slice_fn or slice_batch
        self.torch_device_mesh = torch_device_mesh
        self._init_prepared(
            device, rng_types, None, skip_batches, use_stateful_dataloader, _drop_last, _non_blocking
        )

    _dispatches = True

    def _clone(self, skip_batches: int) -> DataLoaderDispatcher:
        clone = type(self)(self.dataset, skip_batches=skip_batches, **self._init_args)
        clone._progress = self._progress
        return clone

    def _base_len(self) -> int:
        return DataLoader.__len__(self)

    def __len__(self) -> int:
        whole, processes = self._base_len(), _world()[0]
        if self.split_batches:
            steps = whole
        elif self._drop_last:
            steps = whole // processes
        else:
            steps = math.ceil(whole / processes)
        return max(steps - self._skip_once, 0)

    @property
    def total_batch_size(self) -> int | None:
        """Samples per step over all processes."""
        size = self.batch_size
        if size is None:
            return None
        return size if self.split_batches else size * _world()[0]

    def _compute_remainder(self) -> int:
        """-1 as an iteration starts: the main process counts the real samples of the last step and
        sends that count with it (as the reference library's dispatcher does, map-style data too).
        """
        return -1

    def __iter__(self) -> Iterator[object]:
        start = self._start_epoch()
        self.begin()
        completed = False
        try:
            yield from with_batch_boundaries(self._receive(start))
            completed = True
        finally:
            self.end(completed)

    def _receive(self, start: int) -> Iterator[object]:
        processes, rank = _world()
        steps = self._steps(start, processes) if rank == 0 else None
        if rank != 0:
            # The reference starts an iterator of the underlying loader on every process at each epoch
            # (only the main one reads it): its base-seed draw keeps their global generators in step.
            with self._first_iterator_rng(start):
                torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        device = self.device
        send = resolve_send_to_device() if device is not None and device.type != "cpu" else None
        progress, position = self._progress, start
        in_flight: list[Pending] = []  # the main process's sends of the previous step, still under way
        try:
            while True:
                message = self._scatter(steps, processes, rank, in_flight)
                if message is None:
                    return
                is_last, remainder, batch = message
                if is_last:
                    self.end_of_dataloader = True
                    self.remainder = remainder
                    progress.exhausted = True
                if batch is not None:
                    if send is not None:
                        batch = send(batch, device, non_blocking=self._non_blocking)
                    position += 1
                    progress.position = position
                    yield batch
                if is_last:
                    return
        finally:
            wait_all(in_flight)

    @staticmethod
    def _scatter(
        steps: Iterator[list[_Message]] | None, processes: int, rank: int, in_flight: list[Pending]
    ) -> _Message:
        parts = next(steps, None) if steps is not None else None
        if processes == 1:
            return None if parts is None else parts[0]
        main_parts: list[_Message] | None = None
        if rank == 0:
            main_parts = parts if parts is not None else [None for _ in range(processes)]
        return scatter_parts(main_parts, rank, processes, in_flight)

    def _base_batches(self, start_steps: int, processes: int) -> Iterator[object]:
        skip = start_steps * (1 if self.split_batches else processes)
        if isinstance(self.batch_sampler, BatchSamplerShard):
            self.batch_sampler._next_start = skip
            try:
                with self._first_iterator_rng(start_steps):
                    return DataLoader.__iter__(self)
            finally:
                self.batch_sampler._next_start = 0
        with self._first_iterator_rng(start_steps), self._stream_window():
            iterator = DataLoader.__iter__(self)
        _consume(iterator, skip)
        return iterator

    def _tail(self) -> tuple[bool, bool]:
        """``(drop, pad)`` for the epoch's last step: an epoch resumed from a global position keeps its
        tail (padded as ``EpochWindow.pad`` says); otherwise ``drop_last`` and ``even_batches``.
        """
        window = self._progress.window
        if window is None:
            return self._drop_last, self.even_batches
        return False, window.pad

    def _steps(self, start: int, processes: int) -> Iterator[list[_Message]]:
        """Main process: group base batches into steps and cut each into per-process messages.

        One group is read ahead, so the step given out last is marked as such (``end_of_dataloader``
        and ``remainder`` are known while it is used), also when ``drop_last`` drops the short group
        that follows it.
        """
        per_step = 1 if self.split_batches else processes
        base = self._base_batches(start, processes)
        state: _Steps = {"first": None, "size": None}
        group = [batch for _, batch in zip(range(per_step), base, strict=False)]
        sizes = [batch_size_of(batch) for batch in group]
        if sizes:
            state["size"] = sizes[0]
        while group:
            upcoming = [batch for _, batch in zip(range(per_step), base, strict=False)]
            upcoming_sizes = [batch_size_of(batch) for batch in upcoming]
            if upcoming and self._tail()[0] and not self._regular(upcoming_sizes, per_step, processes, state):
                upcoming = []  # the short tail is dropped: this step is the last one
            yield self._cut(group, sizes, not upcoming, per_step, processes, state)
            group, sizes = upcoming, upcoming_sizes

    def _regular(self, sizes: list[int | None], per_step: int, processes: int, state: _Steps) -> bool:
        """Whether a step of batches of ``sizes`` is a full one (cut evenly, no padding needed)."""
        regular = len(sizes) == per_step and all(s == state["size"] for s in sizes)
        if regular and self.split_batches and (sizes[0] or 0) % processes != 0:
            return False
        return regular

    def _cut(
        self,
        group: list[object],
        sizes: list[int | None],
        is_last: bool,
        per_step: int,
        processes: int,
        state: _Steps,
    ) -> list[_Message]:
        regular = self._regular(sizes, per_step, processes, state)
        # One concatenation per step only where a step is cut across batches: with split_batches a
        # step is one batch already, and a regular step of whole batches is passed on as it is.
        whole = group[0] if len(group) == 1 else None
        if state["first"] is None:
            state["first"] = whole if whole is not None else concat_batches(group)
        # The last step tells every process how many of its samples are real (all of a full step).
        remainder = sum(s or 0 for s in sizes) if is_last else -1
        if regular and not self.split_batches:
            return [(is_last, remainder, batch) for batch in group]
        if whole is None:
            whole = concat_batches(group)
        if regular:
            width = (sizes[0] or 0) // processes
            return [
                (is_last, remainder, self._slice(whole, i * width, (i + 1) * width, i))
                for i in range(processes)
            ]
        if self._tail()[0]:
            return [(True, -1, None)] * processes
        return self._cut_last(whole, processes, state["first"])

    def _cut_last(self, whole: object, processes: int, first: object) -> list[_Message]:
        real = batch_size_of(whole) or 0
        width = math.ceil(real / processes)
        if self._tail()[1] and width * processes > real:
            copies = math.ceil((width * processes - real) / max(batch_size_of(first) or 1, 1))
            padding = slice_batch(concat_batches([first] * copies), slice(0, width * processes - real))
            whole = concat_batches([whole, padding])
        remainder = real
        messages: list[_Message] = []
        for i in range(processes):
            lo, hi = i * width, min((i + 1) * width, batch_size_of(whole) or 0)
            messages.append((True, remainder, self._slice(whole, lo, hi, i) if hi > lo else None))
        return messages

    def _slice(self, batch: object, lo: int, hi: int, index: int) -> object:
        return self.slice_fn(batch, slice(lo, hi), process_index=index, num_processes=_world()[0])
