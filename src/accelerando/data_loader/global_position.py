"""The global data position: where one epoch's global order stands, whatever the number of processes.

Every prepared loader cuts one global order per epoch (the sampler's indices, a user batch sampler's
batches, or an iterable dataset's stream) into global batches and deals them between processes. A
checkpoint records, beside the per-process ``position``, how many units of that order were consumed
(all processes together) and the layout that consumed them (``Layout``). A loader prepared on another
number of processes (or with another batch size) turns that into a ``ResumePlan`` for its own layout:

- when the consumed units fill whole global batches of the new layout (and the epoch ends where the
  saved run's did), the plan is a plain batch position;
- otherwise the resumed epoch drops the first ``consumed`` units of the same order and batches and
  shards the rest as usual (an ``EpochWindow``); its tail is kept, padded like ``even_batches``.

The next epoch is a whole one in the new layout. Cases that cannot be continued exactly (the saved run
sharded by a ``DistributedSampler`` or per-process file shards, a changed dataset length, another way
of shuffling, a stream split by loader workers) give a one-line note saying what will differ.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, SupportsInt, cast

from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from accelerando.data_loader.samplers import (
    BatchSamplerShard,
    EpochWindow,
    IterableDatasetShard,
    SeedableRandomSampler,
)

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = [
    "Layout",
    "ResumePlan",
    "collected_notes",
    "count_of",
    "layout_of",
    "needs_translation",
    "plan_resume",
    "report_note",
]

# While ``load_state`` applies states: the notes of loaders that cannot continue exactly, collected so
# that it warns once per loader with the loader's index (a direct ``load_state_dict`` warns itself).
_NOTES: ContextVar[list[tuple[object, str]] | None] = ContextVar("accelerando_position_notes", default=None)


@contextmanager
def collected_notes() -> Iterator[list[tuple[object, str]]]:
    """Collect ``(loader, note)`` pairs instead of warning, inside the block (used by ``load_state``)."""
    notes: list[tuple[object, str]] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def report_note(loader: object, note: str) -> None:
    """Say in one warning line that ``loader`` cannot continue its saved position exactly, and why."""
    notes = _NOTES.get()
    if notes is not None:
        notes.append((loader, note))
        return
    warnings.warn(f"This dataloader cannot continue the saved run exactly: {note}", stacklevel=3)


def warn_collected(notes: list[tuple[object, str]], loaders: list[object], folder: str) -> None:
    """One warning line per loader of ``notes``, naming its index among the prepared ``loaders``."""
    for loader, note in notes:
        index = next((i for i, known in enumerate(loaders) if known is loader), "?")
        warnings.warn(
            f"{folder}: dataloader {index} cannot continue the saved run exactly: {note}", stacklevel=4
        )


@dataclass(frozen=True)
class Layout:
    """How a prepared loader cuts one epoch's global order into steps (recorded in its state).

    Attributes:
        num_processes: Processes sharing the data (data-parallel ranks).
        global_batch: Units of the order one step consumes over all processes.
        unit: ``"samples"`` (indices or stream samples) or ``"batches"`` (a user batch sampler's batches).
        length: Units in one epoch of the order, when known.
        drop_last: The last incomplete global batch is dropped.
        even_batches: The last global batch is padded so that every process gets one.
        split_batches: Each batch is cut between processes.
        dispatch: The main process reads and scatters (``dispatch_batches``).
        batch_size: Samples per batch on one process.
        kind: ``"map"``, ``"iterable"`` or ``"per_process"`` (each process reads its own part: a kept
            ``DistributedSampler`` or per-process file shards; no global order).
        order: ``"sequential"``, ``"seeded"`` (``SeedableRandomSampler``), ``"random"`` (a generator or
            a drawn seed), ``"custom"`` (a user's sampler), ``"stream"`` or ``"workers"`` (a stream
            whose order depends on the loader's workers).
    """

    num_processes: int
    global_batch: int
    unit: str = "samples"
    length: int | None = None
    drop_last: bool = False
    even_batches: bool = True
    split_batches: bool = False
    dispatch: bool = False
    batch_size: int | None = None
    kind: str = "map"
    order: str = "sequential"

    @property
    def end(self) -> int | None:
        """Units of the order the epoch gives out as real data (after ``drop_last``); None if unknown."""
        if self.length is None:
            return None
        return self.length - self.length % self.global_batch if self.drop_last else self.length

    def to_dict(self) -> dict[str, object]:
        """Plain data for a checkpoint (loads with ``weights_only=True``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Layout:
        """The layout a state recorded (unknown keys, from a newer version, are ignored)."""
        known = {f.name for f in fields(cls)}
        # Plain data read back from a checkpoint: the dataclass's own fields, as they were written.
        return cls(**cast("dict[str, Any]", {key: value for key, value in data.items() if key in known}))


@dataclass(frozen=True)
class ResumePlan:
    """How a loader continues a saved global position in its own layout.

    Attributes:
        epoch: The epoch to resume.
        consumed: Units of that epoch's order the saved run had consumed.
        batches: Whole batches of this loader's layout those units amount to: what
            ``resume_point(...).batches_to_skip`` reports and ``skip_first_batches`` is given.
        window: The part of the epoch to give out when ``batches`` alone cannot express the position
            (None: a plain batch position).
        note: What will differ from the saved run, when it cannot be continued exactly.
    """

    epoch: int
    consumed: int
    batches: int
    window: EpochWindow | None = None
    note: str | None = None


def _same_end(saved: Layout, current: Layout) -> bool:
    """Whether the current layout's epoch ends where the saved run's would have."""
    if saved.length is not None and current.length is not None:
        return saved.end == current.end
    if not (saved.drop_last or current.drop_last):
        return True
    return saved.drop_last == current.drop_last and saved.global_batch == current.global_batch


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def _restart_note(saved: Layout, current: Layout, epoch: int) -> str | None:
    """Why the saved position has no meaning in the current layout (the epoch then restarts)."""
    if "per_process" in (saved.kind, current.kind):
        return (
            f"each process read its own part of the data (a DistributedSampler or per-process file shards) "
            f"on {_processes(saved.num_processes)}, so there is no global order to continue on "
            f"{_processes(current.num_processes)}: epoch {epoch} restarts from its first batch (samples already "
            "used come again)"
        )
    if saved.unit != current.unit:
        return (
            f"the saved run counted {saved.unit} and this loader counts {current.unit} (another batch sampler): "
            f"epoch {epoch} restarts from its first batch (samples already used come again)"
        )
    return None


def _order_note(saved: Layout, current: Layout, epoch: int, consumed: int) -> str | None:
    """What makes the rest of the epoch differ although the position is kept (best effort)."""
    rest = f"the rest of epoch {epoch} skips the first {consumed} {saved.unit} of"
    if saved.length is not None and current.length is not None and saved.length != current.length:
        return (
            f"the dataset has {current.length} {current.unit}, the saved run saw {saved.length}: {rest} "
            "the new order, which is not the saved run's"
        )
    if "workers" in (saved.order, current.order):
        return (
            "the stream is split between loader workers, so its order depends on the number of processes "
            f"and workers: {rest} a stream that is not the saved run's"
        )
    if saved.order != current.order:
        return (
            f"the saved run's order was {saved.order!r} and this loader's is {current.order!r} (another sampler "
            f"or use_seedable_sampler): {rest} a new order, so some samples repeat and others are skipped"
        )
    return None


def _tail_note(current: Layout, window: EpochWindow) -> str | None:
    """A tail the DataLoader itself drops: a stream read in batches by one reader with ``drop_last``."""
    if current.kind != "iterable" or not current.drop_last:
        return None
    if current.num_processes > 1 and not current.dispatch:
        return None  # IterableDatasetShard pads the tail to whole batches
    size = current.batch_size or 1
    stop = window.end if window.end is not None else current.length
    if stop is not None and (stop - window.offset) % size == 0:
        return None
    return (
        f"drop_last drops the last incomplete batch of {size} of the resumed epoch (read by one process), "
        "which the saved run (another global batch) would have used"
    )


def plan_resume(saved: Layout, consumed: int, epoch: int, current: Layout) -> ResumePlan:
    """Turn a saved global position into a plan for the current layout (a pure function).

    Args:
        saved: The layout that consumed the units.
        consumed: Units of epoch ``epoch``'s order consumed, all processes together.
        epoch: The epoch the saved run was in.
        current: This loader's layout.

    Returns:
        The plan: a plain batch position when ``consumed`` fills whole global batches of ``current``
        and the epoch ends where the saved run's did; otherwise a window of the order. Over the
        resumed epoch the real units given out are exactly ``order[consumed:saved.end]``, each once,
        in order (unless ``note`` says otherwise).

    Raises:
        ValueError: On a negative ``consumed`` or a layout with a non-positive global batch.
    """
    if consumed < 0 or saved.global_batch < 1 or current.global_batch < 1:
        raise ValueError(
            f"A global data position needs consumed >= 0 and positive global batches, got consumed={consumed}, "
            f"saved global batch {saved.global_batch}, current {current.global_batch}; the state is damaged."
        )
    restart = _restart_note(saved, current, epoch)
    if restart is not None:
        return ResumePlan(epoch, 0, 0, None, restart)
    end = saved.end
    if end is not None and consumed >= end:
        return ResumePlan(epoch + 1, 0, 0, None, None)  # the saved run had used the whole epoch
    note = _order_note(saved, current, epoch, consumed)
    size = current.global_batch
    if consumed % size == 0 and _same_end(saved, current):
        return ResumePlan(epoch, consumed, consumed // size, None, note)
    stride = saved.global_batch if saved.drop_last and end is None else None
    window = EpochWindow(
        offset=consumed,
        end=end if saved.drop_last else None,
        stride=stride,
        pad=current.even_batches or current.drop_last,
    )
    return ResumePlan(epoch, consumed, consumed // size, window, note or _tail_note(current, window))


def count_of(value: object) -> int:
    """An integer read back from a state (a number; None or absent is 0)."""
    return int(cast("SupportsInt", value or 0))


def needs_translation(entry: Mapping[str, object], current: Layout) -> bool:
    """Whether a saved global position differs from what ``position`` alone restores in ``current``.

    The same layout with nothing skipped at the epoch's start keeps today's per-process path exactly.
    """
    layout = entry.get("layout")
    if not isinstance(layout, Mapping):
        return False  # no layout recorded: nothing to translate
    return bool(count_of(entry.get("offset"))) or Layout.from_dict(layout) != current


def legacy_entry(state: Mapping[str, object], current: Layout) -> dict[str, object] | None:
    """The global position of a version-1 state (no ``global``) saved on ``saved_num_processes``.

    Such a state records only the per-process ``position``; the saved layout is taken to be the
    current one on the saved number of processes (the same batch size and flags). None when the
    number of processes is the same (the per-process path applies).
    """
    processes = count_of(state["saved_num_processes"])
    if processes == current.num_processes or processes < 1:
        return None
    if current.split_batches:
        size = current.global_batch
    else:
        size = current.global_batch // max(current.num_processes, 1) * processes
    saved = replace(current, num_processes=processes, global_batch=max(size, 1))
    return {
        "consumed": count_of(state.get("position")) * saved.global_batch,
        "offset": 0,
        "layout": saved.to_dict(),
    }


def mark_saved_processes(entries: list[tuple[str, object] | None], processes: int) -> None:
    """Tell version-1 loader states read on another number of processes how many saved them.

    Args:
        entries: ``(file stem, state)`` per loader as read from a checkpoint (None: no file).
        processes: The saving run's number of processes (from its manifest).
    """
    for entry in entries:
        if entry is not None and isinstance(entry[1], dict) and "global" not in entry[1]:
            entry[1]["saved_num_processes"] = int(processes)


# --------------------------------------------------------------------------- the layout of a loader
def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _order(sampler: object) -> str:
    if isinstance(sampler, SeedableRandomSampler):
        return "seeded"
    if isinstance(sampler, RandomSampler):
        return "random"
    if type(sampler) is SequentialSampler:
        return "sequential"
    return "custom"


def _length(obj: object) -> int | None:
    try:
        return len(cast("Sized", obj)) if isinstance(obj, Sized) else None
    except TypeError:
        return None


def _map_layout(layout: Layout, shard: BatchSamplerShard, per_process: bool = False) -> Layout:
    """``layout`` with the unit, global batch, length and order of map-style data read through ``shard``'s
    batch sampler (dealt between ``layout.num_processes`` processes, or split).
    """
    inner, split, processes = shard.batch_sampler, layout.split_batches, layout.num_processes
    if type(inner) is BatchSampler:
        size = inner.batch_size
        return replace(
            layout,
            unit="samples",
            global_batch=size if split else size * processes,
            length=_length(inner.sampler),
            order=_order(inner.sampler),
        )
    return replace(
        layout,
        unit="batches",
        global_batch=1 if split else processes,
        length=_length(inner),
        order="custom" if per_process else _order(getattr(inner, "sampler", None)),
    )


def _stream_order(loader: DataLoader[object], dataset: object) -> str:
    workers = int(getattr(loader, "num_workers", 0) or 0)
    if workers and not (isinstance(dataset, IterableDatasetShard) and dataset.split_by_worker):
        return "workers"
    return "stream"


def _dispatcher_layout(loader: DataLoader[object], processes: int) -> Layout:
    split = bool(getattr(loader, "split_batches", False))
    size = int(getattr(loader, "batch_size", None) or 1)
    dataset = loader.dataset
    layout = Layout(
        num_processes=processes,
        global_batch=size if split else size * processes,
        length=_length(dataset),
        drop_last=bool(getattr(loader, "_drop_last", False)),
        even_batches=bool(getattr(loader, "even_batches", True)),
        split_batches=split,
        dispatch=True,
        batch_size=size // processes if split else size,
        kind="iterable",
        order=_stream_order(loader, dataset),
    )
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, BatchSamplerShard):
        return _map_layout(replace(layout, kind="map"), batch_sampler)
    return layout


def _iterable_layout(loader: DataLoader[object], dataset: object) -> Layout:
    if isinstance(dataset, IterableDatasetShard):
        return Layout(
            num_processes=dataset.num_processes,
            global_batch=dataset.global_batch_size,
            length=_length(dataset.dataset),
            drop_last=dataset.drop_last,
            even_batches=dataset.even_batches,
            split_batches=dataset.split_batches,
            batch_size=dataset.process_batch_size,
            kind="iterable",
            order=_stream_order(loader, dataset),
        )
    world = _world()
    size = int(loader.batch_size or 1)
    return Layout(
        num_processes=world,
        global_batch=size * world,
        length=_length(dataset),
        drop_last=bool(loader.drop_last),
        batch_size=size,
        kind="iterable" if world == 1 else "per_process",
        order=_stream_order(loader, dataset),
    )


def layout_of(prepared: object) -> Layout:
    """The layout of a prepared loader (``DataLoaderShard`` or ``DataLoaderDispatcher``).

    Args:
        prepared: The prepared loader.

    Returns:
        Its ``Layout``: what a checkpoint of its position records.
    """
    loader = cast("DataLoader[object]", prepared)  # a PreparedLoaderMixin is always built on a DataLoader
    if getattr(loader, "_dispatches", False):
        return _dispatcher_layout(loader, _world())
    dataset = loader.dataset
    candidates = (loader.batch_sampler, getattr(loader, "sampler", None))
    shard = next((c for c in candidates if isinstance(c, BatchSamplerShard)), None)
    if shard is None and isinstance(dataset, IterableDataset):
        return _iterable_layout(loader, dataset)
    if shard is None:  # map-style data without batching: one sample per step, one process
        sampler = loader.sampler
        return Layout(num_processes=1, global_batch=1, length=_length(sampler), order=_order(sampler))
    per_process = isinstance(shard.sampler, DistributedSampler) and _world() > 1
    layout = Layout(
        num_processes=shard.num_processes,
        global_batch=1,
        drop_last=shard.drop_last,
        even_batches=shard.even_batches,
        split_batches=shard.split_batches,
        batch_size=cast("int | None", getattr(loader, "batch_size", None)),
        kind="per_process" if per_process else "map",
    )
    layout = _map_layout(layout, shard, per_process)
    return replace(layout, num_processes=_world()) if per_process else layout
