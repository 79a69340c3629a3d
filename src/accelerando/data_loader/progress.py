"""What prepared dataloaders share: epoch progress, RNG bookkeeping, GradientState hooks, state dicts.

A loader returned by ``skip_first_batches`` shares its ``_Progress`` with the loader it came from, so
finishing the resumed epoch on it advances the original loader too, and a checkpoint taken from
either describes the same run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, SupportsInt, TypeGuard, cast

import torch
from torch.utils.data import IterableDataset

from accelerando.common.random import synchronize_rng_states
from accelerando.core.gradient_state import GradientState
from accelerando.data_loader.adapter import DataLoaderStateMixin, get_sampler, set_sampler
from accelerando.data_loader.batches import batch_size_of
from accelerando.data_loader.global_position import (
    Layout,
    ResumePlan,
    count_of,
    layout_of,
    legacy_entry,
    needs_translation,
    plan_resume,
    report_note,
)
from accelerando.data_loader.samplers import (
    BatchSamplerShard,
    EpochWindow,
    IterableDatasetShard,
    SeedableRandomSampler,
    _GlobalDrawRandomSampler,
    _has_set_epoch,
    _WindowedStream,
)

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from accelerando.data_loader._typing import RngTypes

__all__ = ["PreparedLoaderMixin"]

# 2 adds ``global`` (the position in the epoch's global order and the layout); 1 is still read.
_STATE_VERSION = 2


@dataclass
class _Progress:
    """Where a prepared loader stands; shared between a loader and its ``skip_first_batches`` copies."""

    epoch: int = 0
    position: int = 0
    in_epoch: bool = False
    epoch_rng_state: torch.Tensor | None = None
    pending_rng_state: torch.Tensor | None = None
    pending_position: int = 0
    seed_synced: bool = False
    generator_synced: bool = False
    loader_state: dict[str, object] | None = None
    pending_loader_state: dict[str, object] | None = None
    # Every batch of the epoch was given out (the underlying iterator is already exhausted): a state
    # captured now describes the start of the next epoch.
    exhausted: bool = False
    # A state was loaded: the epoch it resumes drew its iterator's seeds before the save, and the
    # restored generators hold those draws. ``replaying`` is that, for the epoch started mid-way.
    restored: bool = False
    replaying: bool = False
    # A state saved on another layout: how this loader continues it (taken when the epoch starts), and
    # the part of the global order the current epoch gives out when it started from one.
    plan: ResumePlan | None = None
    window: EpochWindow | None = None


class _Totalled(Protocol):
    """A dataset that knows the length of the whole data (an ``IterableDatasetShard``'s source, say)."""

    @property
    def total_length(self) -> SupportsInt: ...


def _has_total_length(dataset: object) -> TypeGuard[_Totalled]:
    return hasattr(dataset, "total_length")


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _find_sampler(batch_sampler: object) -> object:
    """The index sampler under one or two levels of batch samplers, if any."""
    sampler = getattr(batch_sampler, "sampler", None)
    if sampler is None:
        sampler = getattr(getattr(batch_sampler, "batch_sampler", None), "sampler", None)
    return sampler


class PreparedLoaderMixin(DataLoaderStateMixin):
    """Behaviour common to ``DataLoaderShard`` and ``DataLoaderDispatcher`` (not used on its own).

    Subclasses call ``_init_prepared`` from ``__init__`` and wrap each epoch in ``_start_epoch`` /
    ``begin`` / ``end``.
    """

    dataset: Dataset[object]
    batch_sampler: Iterable[list[int]] | None
    # The main process reads and scatters (DataLoaderDispatcher).
    _dispatches: ClassVar[bool] = False

    def _init_prepared(
        self,
        device: torch.device | str | None,
        rng_types: RngTypes | None,
        synchronized_generator: torch.Generator | None,
        skip_batches: int,
        use_stateful_dataloader: bool,
        drop_last: bool,
        non_blocking: bool,
    ) -> None:
        self.device = torch.device(device) if device is not None else None
        self.rng_types = list(rng_types) if rng_types is not None else None
        if synchronized_generator is None:
            sampler = _find_sampler(self.batch_sampler)
            if not isinstance(sampler, SeedableRandomSampler):
                synchronized_generator = getattr(sampler, "generator", None)
        self.synchronized_generator = synchronized_generator
        self.use_stateful_dataloader = bool(use_stateful_dataloader)
        self._drop_last = bool(drop_last)
        self._non_blocking = bool(non_blocking)
        self._skip_once = int(skip_batches)
        self._progress = _Progress()
        # Built on torchdata's base, a prepared loader draws its first iterator's seeds at once: the
        # state of the generator it drew from, before that draw, replayed by its first iterator (a
        # loader's own, not shared with its ``skip_first_batches`` copies).
        self._first_iterator_rng_state: torch.Tensor | None = None
        self.end_of_dataloader = False
        self.remainder = -1
        self.resume_note: str | None = None

    # DataLoader forbids setting these after construction and reports None for them when a batch
    # sampler is given; report the per-process values instead.
    @property
    def batch_size(self) -> int | None:  # type: ignore[override]
        """Samples per batch on this process."""
        sampler = self.__dict__.get("batch_sampler")
        if isinstance(sampler, BatchSamplerShard) and sampler.batch_size is not None:
            size = sampler.batch_size
            return size // sampler.num_processes if sampler.split_batches else size
        return self.__dict__.get("_plain_batch_size")

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self.__dict__["_plain_batch_size"] = value

    @property
    def drop_last(self) -> bool:  # type: ignore[override]
        """Whether the last incomplete batch is dropped."""
        sampler = self.__dict__.get("batch_sampler")
        if isinstance(sampler, BatchSamplerShard):
            return sampler.drop_last
        return bool(self.__dict__.get("_plain_drop_last", False))

    @drop_last.setter
    def drop_last(self, value: bool) -> None:
        self.__dict__["_plain_drop_last"] = value

    @property
    def skip_batches(self) -> int:
        """Batches the next iteration skips (set by ``skip_first_batches``; 0 once it has started)."""
        return self._skip_once

    def resume_at(self, position: int) -> None:
        """Start the next iteration ``position`` batches into the current epoch, in place.

        What a stateful loader does after ``load_state_dict``, for any prepared loader: the epoch's
        order (sampler seed, generator state) is the restored one, and the batches before
        ``position`` are skipped without being yielded. Unlike ``skip_first_batches`` this returns
        no new loader, so the object the training loop holds resumes. A position already pending
        (a stateful loader's restored one) is kept when ``position`` is 0. For a state loaded from
        another layout, ``position`` equal to ``resume_position()[1]`` starts at the exact sample
        (see ``load_state_dict``).

        Args:
            position: Batches of the epoch already given out before the checkpoint.

        Raises:
            ValueError: ``position`` is negative.
        """
        if position < 0:
            raise ValueError(f"resume_at needs a position of 0 or more batches, got {position}")
        progress = self._progress
        if position:
            progress.pending_position = progress.position = int(position)

    def _draw_first_iterator_seeds(self) -> None:
        """Draw, while being built, the random numbers the first epoch's iterator will use.

        The reference library builds its stateful loader's first iterator at once (torchdata's
        ``StatefulDataLoader`` starts one to answer ``state_dict`` before any iteration), so the base
        seed (and, with workers, the shuffling seed their prefetch draws) leaves the global generator
        at ``prepare`` time, not when the first epoch starts. Drawing them here, and replaying them
        when the first iterator is created (``_first_iterator_rng``), gives the same batches and the
        same later random numbers (dropout masks) as the reference for the same seed.
        """
        generator: torch.Generator | None = getattr(self, "generator", None)
        self._first_iterator_rng_state = torch.get_rng_state() if generator is None else generator.get_state()
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        workers = int(getattr(self, "num_workers", 0) or 0)
        if (
            generator is None
            and workers > 0
            and isinstance(_find_sampler(self.batch_sampler), _GlobalDrawRandomSampler)
        ):
            torch.empty((), dtype=torch.int64).random_()

    @contextmanager
    def _first_iterator_rng(self, start: int) -> Iterator[None]:
        """Create the first epoch's iterator from the seeds drawn when the loader was built.

        Inside the block the generator that gives the base seed is back where it stood before
        ``_draw_first_iterator_seeds`` drew; afterwards the global generator is where it was on
        entry, as if the iterator had been created already. When that generator also shuffles, the
        state the epoch is saved with (``state_dict``'s ``generator_state``) is this one: the
        iterator is created from it, and a resumed run must replay it (the state after the
        prepare-time draw would give another order). Without such a draw pending (a
        ``skip_first_batches`` copy starts an iterator of its own, as the reference's does), or for
        an epoch started mid-way, nothing changes.

        Args:
            start: The batch the epoch starts at.
        """
        saved = self._first_iterator_rng_state
        generator: torch.Generator | None = getattr(self, "generator", None)
        if saved is None or start > 0:
            yield
            return
        self._first_iterator_rng_state = None
        if generator is not None:
            generator.set_state(saved)
            if generator is self.synchronized_generator and self._progress.in_epoch:
                self._progress.epoch_rng_state = saved.clone()
            yield
            return
        now = torch.get_rng_state()
        torch.set_rng_state(saved)
        try:
            yield
        finally:
            torch.set_rng_state(now)

    def get_sampler(self) -> object:
        """The index sampler this loader draws from (see :func:`accelerando.data_loader.get_sampler`)."""
        return get_sampler(self)

    def set_sampler(self, sampler: Iterable[int]) -> None:
        """Draw indices from ``sampler`` from the next iteration on (every batch-sampler level)."""
        set_sampler(self, sampler)

    def adjust_state_dict_for_prefetch(self) -> None:
        """Kept for the reference's API: nothing to adjust here.

        The state is counted in batches given out (not batches read ahead), and a torchdata state
        is captured before each read-ahead, so ``state_dict`` never describes a batch still unseen.
        """

    # ------------------------------------------------------------------ epochs
    @property
    def iteration(self) -> int:
        """Number of the current epoch (epochs completed so far, when between epochs)."""
        return self._progress.epoch

    @iteration.setter
    def iteration(self, value: int) -> None:
        self._progress.epoch = int(value)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch: forwarded to the sampler and the batch sampler(s) that take it, else the dataset.

        Args:
            epoch: The epoch number; seeded samplers draw their order from it.
        """
        self._progress.epoch = int(epoch)
        batch_sampler = self.batch_sampler
        # A user's batch sampler is kept inside this library's BatchSamplerShard: reach it too.
        wrapped = batch_sampler.batch_sampler if isinstance(batch_sampler, BatchSamplerShard) else None
        reached: list[object] = []
        for target in (_find_sampler(batch_sampler), batch_sampler, wrapped):
            if target is not None and _has_set_epoch(target) and all(t is not target for t in reached):
                target.set_epoch(epoch)
                reached.append(target)
        dataset = self.dataset
        if not reached and _has_set_epoch(dataset):
            dataset.set_epoch(epoch)

    def _sync_seed(self) -> None:
        sampler = _find_sampler(self.batch_sampler)
        if isinstance(sampler, SeedableRandomSampler) and not self._progress.seed_synced:
            if _distributed():
                import torch.distributed as dist

                seed = torch.tensor([sampler.initial_seed], dtype=torch.int64, device=_collective_device())
                dist.broadcast(seed, src=0)
                sampler.initial_seed = int(seed.item())
            self._progress.seed_synced = True

    def _sync_rngs(self) -> None:
        types = [str(t) for t in self.rng_types or []]
        generator = self.synchronized_generator
        if generator is None:
            types = [t for t in types if t != "generator"]
        elif (
            getattr(_find_sampler(self.batch_sampler), "_owned_generator", False)
            and self._progress.generator_synced
        ):
            # A generator this library created is drawn from only by the sampler, identically on every
            # process: once synchronised it stays so, and an epoch need not pay a collective.
            types = [t for t in types if t != "generator"]
        elif "generator" not in types:
            # Every process must shuffle alike for the shards to partition the data.
            types.append("generator")
        if types and _distributed():
            synchronize_rng_states(types, generator=generator)
        self._progress.generator_synced = True

    def _start_epoch(self) -> int:
        """Prepare the RNGs and the sampler for an epoch; return the batch to start at."""
        progress = self._progress
        start = max(self._skip_once, progress.pending_position)
        self._skip_once = progress.pending_position = 0
        plan, progress.plan = progress.plan, None
        # A global position from another layout: the epoch's rest, when asked for its batch count.
        window = None
        if (
            plan is not None
            and plan.window is not None
            and plan.epoch == progress.epoch
            and start == plan.batches
        ):
            window, start = plan.window, 0
        progress.replaying, progress.restored = progress.restored and (start > 0 or window is not None), False
        self._sync_seed()
        generator = self.synchronized_generator
        if progress.pending_rng_state is not None and generator is not None:
            generator.set_state(progress.pending_rng_state)
            progress.pending_rng_state = None
        else:
            self._sync_rngs()
        if generator is not None:
            progress.epoch_rng_state = generator.get_state()
        self.set_epoch(progress.epoch)
        progress.in_epoch = True
        progress.exhausted = False
        progress.position = start
        progress.window = window
        self._set_window(window)
        return start

    def _set_window(self, window: EpochWindow | None) -> None:
        """Give the sampler or dataset shard the window of the epoch about to start (None: the whole)."""
        shard, dataset = self._shard(), self.dataset
        if shard is not None:
            shard.window = window
        elif isinstance(dataset, IterableDatasetShard):
            dataset.window = window

    @contextmanager
    def _stream_window(self) -> Iterator[None]:
        """While the epoch's iterator is created: a plain iterable dataset is read through the window."""
        window, dataset = self._progress.window, self.dataset
        if (
            window is None
            or isinstance(dataset, IterableDatasetShard)
            or not isinstance(dataset, IterableDataset)
        ):
            yield
            return
        # DataLoader refuses to set ``dataset`` after construction; its iterator reads it once, here.
        self.__dict__["dataset"] = _WindowedStream(dataset, window)
        try:
            yield
        finally:
            self.__dict__["dataset"] = dataset

    def begin(self) -> None:
        """Register with ``GradientState`` at the start of an iteration."""
        self.end_of_dataloader = False
        self.remainder = self._compute_remainder()
        GradientState()._add_dataloader(self)

    def end(self, completed: bool | None = None) -> None:  # type: ignore[override]
        """Unregister from ``GradientState``; move to the next epoch when the epoch was completed.

        Args:
            completed: Whether every batch of the epoch was produced (False after a ``break``). Unset
                (a user calling ``end()`` inside the loop, as with the reference library): whether the
                last batch was given out, so a state saved afterwards still resumes mid-epoch.
        """
        GradientState()._remove_dataloader(self)
        if completed is None:
            completed = self._progress.in_epoch and self._progress.exhausted
        if completed:
            progress = self._progress
            progress.epoch += 1
            progress.position = 0
            progress.in_epoch = False
            progress.exhausted = False
            progress.loader_state = None
            progress.window = None
            self._set_window(None)

    # ----------------------------------------------------------------- sizes
    def _shard(self) -> BatchSamplerShard | None:
        """The ``BatchSamplerShard`` this loader draws from (as batch sampler, or as sampler)."""
        for candidate in (self.batch_sampler, getattr(self, "sampler", None)):
            if isinstance(candidate, BatchSamplerShard):
                return candidate
        return None

    def _compute_remainder(self) -> int:
        """``remainder`` as an iteration starts: the dataset's length modulo the global batch size.

        Known in advance for map-style data (whatever the number of processes or ``even_batches``),
        as the reference library does: 0 when the length divides evenly, -1 with ``drop_last`` or when
        the length or the global batch size is unknown. Iterable data learns it at its last batch
        (see ``_last_remainder``).
        """
        window = self._progress.window
        if self._shard() is None or (self.drop_last and window is None):
            return -1
        size = self.total_batch_size
        if not size:
            return -1
        try:
            length = self.total_dataset_length
        except TypeError:
            return -1
        if window is None:
            return length % size
        left = window.count(length) % size  # a resumed epoch keeps its tail, also with drop_last
        return left if left or not self.drop_last else -1

    def _last_remainder(self, last_batch: object) -> int:
        """``remainder`` once the last batch of iterable data is given out: the real samples in the
        final global batch (a full global batch when nothing was left over or the rest was dropped).

        Args:
            last_batch: The batch about to be given out (its size is the answer on one process).
        """
        dataset = self.dataset
        if isinstance(dataset, IterableDatasetShard):
            # Counted by the dataset in this process; with workers it ran in a worker's copy.
            return dataset.last_remainder
        if self.batch_size is None:
            return -1
        size = batch_size_of(last_batch)
        return -1 if size is None else int(size)

    @property
    def total_batch_size(self) -> int | None:
        """Samples per optimizer step over all processes (one global batch)."""
        sampler, dataset = self._shard(), self.dataset
        if sampler is not None:
            return sampler.global_batch_size
        if isinstance(dataset, IterableDatasetShard):
            return dataset.global_batch_size
        return getattr(self, "batch_size", None)

    @property
    def total_dataset_length(self) -> int:
        """Number of samples in the whole dataset (all processes together)."""
        dataset = self.dataset
        if _has_total_length(dataset):
            return int(dataset.total_length)
        if isinstance(dataset, IterableDatasetShard):
            return len(dataset.dataset)  # type: ignore[arg-type]
        # A map-style dataset has a length; len raises TypeError for one that has not.
        return len(cast("Sized", dataset))

    # ------------------------------------------------------------ state dicts
    def state_dict(self) -> dict[str, object]:
        """Capture where this loader stands, for an exact resume.

        A state captured after the last batch of an epoch was given out (inside the loop, after the
        last step) describes the start of the next epoch, so that resuming there continues with it.

        Returns:
            A plain dict: ``epoch``, ``position`` (batches given out in the epoch, on this process),
            ``version``, ``global`` (the global position: ``consumed``, the units of the epoch's global
            order used by all processes together; ``offset``, the units skipped before ``position``
            counts, when the epoch was itself resumed from another layout; ``layout``, how this loader
            cuts the order: processes, batch sizes, flags, dataset length) and, when the order is
            random, ``generator_state`` (the shuffling generator's state at the start of the epoch),
            ``sampler_seed`` (seeded sampler) or ``epoch_seed`` (the seed a single process drew from
            the global generator for the current epoch).
        """
        progress = self._progress
        finished = progress.in_epoch and progress.exhausted
        in_epoch = progress.in_epoch and not finished
        state: dict[str, object] = {
            "version": _STATE_VERSION,
            "epoch": progress.epoch + 1 if finished else progress.epoch,
            "position": progress.position if in_epoch else 0,
        }
        generator = self.synchronized_generator
        if generator is not None:
            snapshot = progress.epoch_rng_state if in_epoch else None
            if snapshot is None and not finished:
                snapshot = progress.pending_rng_state
            state["generator_state"] = (snapshot if snapshot is not None else generator.get_state()).clone()
        sampler = _find_sampler(self.batch_sampler)
        if isinstance(sampler, SeedableRandomSampler):
            state["sampler_seed"] = int(sampler.initial_seed)
        if isinstance(sampler, _GlobalDrawRandomSampler):
            seed = sampler.epoch_seed if in_epoch else (None if finished else sampler.pending_seed)
            if seed is not None:
                state["epoch_seed"] = int(seed)
            drawn = sampler.epoch_state if in_epoch else (None if finished else sampler.pending_state)
            if drawn is not None:  # an order replayed from a run on several processes
                state["generator_state"] = drawn.clone()
        if in_epoch and progress.loader_state is not None:
            state["loader_state"] = progress.loader_state
        state["global"] = self._global_position(in_epoch, finished)
        return state

    def _global_position(self, in_epoch: bool, finished: bool) -> dict[str, object]:
        """``state_dict``'s ``global`` entry: units of the epoch's global order consumed, and the layout."""
        progress, layout = self._progress, layout_of(self)
        plan, window = progress.plan, progress.window
        if in_epoch:
            offset = window.offset if window is not None else 0
            consumed = offset + progress.position * layout.global_batch
            stop = window.end if window is not None and window.end is not None else layout.length
            consumed = consumed if stop is None else min(consumed, max(stop, offset))
        elif plan is not None and not finished:  # loaded, not iterated yet: the loaded position stands
            offset = consumed = plan.consumed
        else:
            offset = consumed = 0
        return {"consumed": consumed, "offset": offset, "layout": layout.to_dict()}

    def resume_position(self) -> tuple[int, int] | None:
        """``(epoch, batches)`` that continue a state loaded from another layout, before it is used.

        ``batches`` counts this loader's batches (what ``resume_point(...).batches_to_skip`` reports):
        ``skip_first_batches(loader, batches)`` (or ``resume_at(batches)``, or a stateful loader by
        itself) then starts at the exact sample the saved run stopped at, also when that is not a
        whole number of this loader's batches. None when no such state is pending.
        """
        plan = self._progress.plan
        return None if plan is None else (plan.epoch, plan.batches)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state from ``state_dict()``; the next iteration replays that epoch's order.

        Without ``use_stateful_dataloader`` the position inside the epoch is not restored: call
        ``skip_first_batches(loader, position)`` as with the reference library. With it, the next
        iteration starts right after the last batch given out before the save. A state written by
        the reference library's stateful loader (torchdata's keys, ``_num_yielded``) is accepted too:
        its position is restored, but it does not record the order of a shuffled epoch.

        A state saved on another number of processes (or batch size, or ``split_batches``...)
        continues the same global order: over the rest of the epoch all processes together get
        exactly the samples the saved run had not used yet, each once, in its order. The position is
        then counted in this loader's batches (``resume_position()``, ``resume_point(...)
        .batches_to_skip``, rounded down); skipping that many (``skip_first_batches``, ``resume_at``,
        or a stateful loader by itself) starts at the exact sample, dropping the used samples of a
        batch that straddles the position; the resumed epoch keeps its tail (padded as
        ``even_batches`` pads it, also with ``drop_last``). Skipping another count skips that many
        batches of the epoch. Where this cannot be exact (see ``global_position``) one warning line
        says what will differ; ``resume_note`` keeps it.

        Args:
            state_dict: A dict returned by ``state_dict()``.

        Raises:
            ValueError: When ``state_dict`` is neither this library's state nor torchdata's.
        """
        if "epoch" not in state_dict and "_num_yielded" in state_dict:
            state_dict = _from_torchdata_state(self, state_dict)
        if "epoch" not in state_dict:
            raise ValueError(
                "load_state_dict expects the dict returned by a prepared dataloader's state_dict() "
                f"(with 'epoch' and 'position'), got keys {sorted(state_dict)}."
            )
        progress = self._progress
        self._first_iterator_rng_state = None  # the restored generators hold the saved run's draws
        # Only a state that records the epoch's order replays it; without one (``{"epoch": n}``) the
        # rest of the epoch draws a new order from the restored generators, as the reference does.
        progress.restored = any(
            key in state_dict for key in ("generator_state", "epoch_seed", "sampler_seed")
        )
        progress.epoch = int(state_dict["epoch"])
        progress.in_epoch = False
        progress.exhausted = False
        position = int(state_dict.get("position", 0))
        progress.pending_position = position if self.use_stateful_dataloader else 0
        progress.position = progress.pending_position
        if self.use_stateful_dataloader and state_dict.get("loader_state") is not None:
            progress.pending_loader_state = state_dict["loader_state"]
        saved_rng = state_dict.get("generator_state")
        progress.pending_rng_state = None if saved_rng is None else torch.as_tensor(saved_rng).clone()
        sampler = _find_sampler(self.batch_sampler)
        if "sampler_seed" in state_dict and isinstance(sampler, SeedableRandomSampler):
            sampler.initial_seed = int(state_dict["sampler_seed"])
            progress.seed_synced = True
        if isinstance(sampler, _GlobalDrawRandomSampler):
            seed = state_dict.get("epoch_seed")
            sampler.pending_seed = None if seed is None else int(seed)
            sampler.pending_state = (
                None if seed is not None or saved_rng is None else progress.pending_rng_state
            )
        progress.plan, self.resume_note = None, None
        entry, current = state_dict.get("global"), layout_of(self)
        if not isinstance(entry, Mapping) and "saved_num_processes" in state_dict:
            entry = legacy_entry(state_dict, current)  # version 1, saved on another number of processes
        if isinstance(entry, Mapping) and needs_translation(entry, current):
            self._continue_global(state_dict, entry, current)

    def _continue_global(
        self, state: Mapping[str, object], entry: Mapping[str, object], current: Layout
    ) -> None:
        """Turn a global position saved on another layout into this loader's plan (after the restore)."""
        epoch, saved = count_of(state["epoch"]), cast("Mapping[str, object]", entry["layout"])
        plan = plan_resume(Layout.from_dict(saved), count_of(entry.get("consumed")), epoch, current)
        progress = self._progress
        progress.epoch, progress.pending_loader_state = plan.epoch, None  # torchdata's state is per layout
        progress.pending_position = plan.batches if self.use_stateful_dataloader else 0
        progress.position = progress.pending_position
        progress.plan = plan
        if plan.epoch != epoch:
            progress.restored, progress.pending_rng_state = False, None
        elif state.get("epoch_seed") is not None and self.synchronized_generator is not None:
            # One process drew this epoch's seed; several shuffle with a generator: the same permutation.
            generator = torch.Generator()
            generator.manual_seed(count_of(state["epoch_seed"]))
            progress.pending_rng_state = generator.get_state()
        self.resume_note = plan.note
        if plan.note is not None:
            report_note(self, plan.note)


def _from_torchdata_state(loader: PreparedLoaderMixin, state: Mapping[str, Any]) -> dict[str, Any]:
    """Translate a torchdata ``StatefulDataLoader`` state (the reference's ``dl_state_dict.bin``)."""
    import warnings

    progress = loader._progress
    if state.get("_iterator_finished"):
        return {"epoch": progress.epoch + 1, "position": 0}
    sampler = _find_sampler(loader.batch_sampler)
    if isinstance(sampler, _GlobalDrawRandomSampler) and state.get("_num_yielded"):
        warnings.warn(
            "This dataloader state was written by the reference library's stateful loader: it restores "
            "the position inside the epoch but not that shuffled epoch's order, so the rest of the epoch "
            "draws a new order (as the reference library does).",
            stacklevel=3,
        )
    return {"epoch": progress.epoch, "position": int(state.get("_num_yielded") or 0)}


def _collective_device() -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
