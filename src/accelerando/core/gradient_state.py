"""GradientState: the process-wide view of gradient accumulation and dataloader progress.

Contract (who calls what):
- ``Accelerator`` sets the accumulation plugin once (``_configure``) and flips ``sync_gradients``
  at the start of every ``accumulate`` block (``_set_sync_gradients``).
- Prepared dataloaders (``DataLoaderShard`` / ``DataLoaderDispatcher``) call ``_add_dataloader(self)``
  when an iteration starts and ``_remove_dataloader(self)`` when it ends; while registered they expose
  ``end_of_dataloader: bool`` (True while the last batch is being used) and ``remainder: int`` (number
  of real samples in the last global batch when the dataset does not divide evenly, else -1).
- Something that must act between two training steps, after the loop body of the last one ran (a
  preemption checkpoint), sets ``at_next_batch``; prepared dataloaders (through
  :func:`with_batch_boundaries`) and the next ``accumulate`` entry call :meth:`GradientState.reach_batch_boundary`
  when it is set, before the next batch is read or given out.
- Everything else only reads.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from accelerando.core.settings import environment_setting

__all__ = ["GradientState", "with_batch_boundaries"]

T = TypeVar("T")


class AccumulationOptions(Protocol):
    """What GradientState reads of a ``GradientAccumulationPlugin`` (a layer above this one)."""

    @property
    def num_steps(self) -> int | None:
        """Micro-batches per optimizer step (None: not set yet)."""
        ...

    @property
    def adjust_scheduler(self) -> bool:
        """Whether prepared schedulers account for accumulation."""
        ...

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the last batch of a dataloader always synchronises."""
        ...

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients are all-reduced on every micro-batch."""
        ...

    def to_kwargs(self) -> dict[str, object]:
        """The fields that differ from their defaults."""
        ...


class IteratedLoader(Protocol):
    """What GradientState reads of a prepared dataloader while it is being iterated."""

    @property
    def end_of_dataloader(self) -> bool:
        """True while the last batch is in use."""
        ...

    @property
    def remainder(self) -> int:
        """Real samples in the final global batch, or -1 when the dataset divides evenly."""
        ...


#: How a registered dataloader is held: a weak reference, or a call returning it (no weakref support).
LoaderRef = Callable[[], IteratedLoader | None]


class GradientState:
    """Shared (Borg) state of gradient synchronisation; every instance sees the same values.

    Attributes:
        sync_gradients: True when the current backward pass must all-reduce and the optimizer step
            must run (the last micro-batch of an accumulation cycle).
        num_steps: number of micro-batches per optimizer step.
        adjust_scheduler: whether the scheduler accounts for accumulation.
        sync_with_dataloader: force a sync at the end of each dataloader.
        sync_each_batch: all-reduce on every micro-batch (saves memory, costs communication).
        plugin_kwargs: the accumulation plugin's fields that differ from its defaults
            (``GradientAccumulationPlugin.to_kwargs()``), always with the current ``num_steps``;
            empty before any Accelerator.
        at_next_batch: called once at the next batch boundary (the loop asks a prepared dataloader
            for its next batch, or enters ``accumulate``), then cleared; None: nothing waits for one.
    """

    _shared_state: dict[str, object] = {}

    def __init__(self, gradient_accumulation_plugin: AccumulationOptions | None = None) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state.get("_initialized", False):
            self.sync_gradients = True
            # Weak references: a loader dropped mid-iteration (its last reference gone) is freed at once,
            # as with the reference library, rather than kept alive by this process-wide state.
            self._dataloader_references_ref: list[LoaderRef | None] = [None]
            # The innermost one's reference, kept apart for the training step (one lookup, no call).
            self._active_dataloader_ref: LoaderRef | None = None
            self._num_steps = 1
            self._adjust_scheduler = True
            self._sync_with_dataloader = True
            self.sync_each_batch = False
            self._is_xla_gradients_synced = False
            # What the accumulation plugin was given beyond its defaults (the reference's dict;
            # transformers' Trainer reads ``plugin_kwargs.get("sync_each_batch")``).
            self.plugin_kwargs: dict[str, object] = {}
            self.at_next_batch: Callable[[], object] | None = None
            self._initialized = True
        if gradient_accumulation_plugin is not None:
            self._configure(gradient_accumulation_plugin)

    def _configure(self, plugin: AccumulationOptions) -> None:
        steps = plugin.num_steps
        if steps is None:  # the Accelerator sets it from the settings before configuring
            raise TypeError("the gradient accumulation plugin's num_steps is None; set it to an int >= 1")
        self.plugin_kwargs = plugin.to_kwargs()
        self.num_steps = int(steps)
        self._adjust_scheduler = bool(plugin.adjust_scheduler)
        self._sync_with_dataloader = bool(plugin.sync_with_dataloader)
        self.sync_each_batch = bool(plugin.sync_each_batch)

    @property
    def num_steps(self) -> int:
        """Micro-batches per optimizer step (``Accelerator.gradient_accumulation_steps`` sets it)."""
        return self._num_steps

    @num_steps.setter
    def num_steps(self, value: int) -> None:
        if isinstance(value, bool) or int(value) < 1:
            raise ValueError(f"gradient accumulation steps must be an integer >= 1, got {value!r}")
        self._num_steps = int(value)
        self.plugin_kwargs["num_steps"] = self._num_steps

    @property
    def adjust_scheduler(self) -> bool:
        """Whether prepared schedulers account for accumulation (from the accumulation plugin)."""
        return self._adjust_scheduler

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the last batch of a dataloader always synchronises (from the accumulation plugin)."""
        return self._sync_with_dataloader

    @property
    def _active_dataloader(self) -> IteratedLoader | None:
        ref = self._active_dataloader_ref
        return None if ref is None else ref()

    @property
    def active_dataloader(self) -> IteratedLoader | None:
        """The prepared dataloader being iterated (the innermost one when loops nest), or None."""
        return self._active_dataloader

    @property
    def dataloader_references(self) -> list[IteratedLoader | None]:
        """The prepared dataloaders being iterated, outermost first, after a leading None."""
        return [None if ref is None else ref() for ref in self._dataloader_references_ref]

    @property
    def is_xla_gradients_synced(self) -> bool:
        """Whether XLA gradients were already all-reduced this step (always True under FSDP).

        Only the XLA path writes it; elsewhere it stays False.
        """
        return bool(environment_setting("use_fsdp")) or self._is_xla_gradients_synced

    @is_xla_gradients_synced.setter
    def is_xla_gradients_synced(self, is_synced: bool) -> None:
        self._is_xla_gradients_synced = bool(is_synced)

    @property
    def initialized(self) -> bool:
        """Whether the shared state has been created in this process."""
        return bool(GradientState._shared_state.get("_initialized", False))

    @property
    def end_of_dataloader(self) -> bool:
        """True while the last batch of the active prepared dataloader is in use."""
        loader = self.active_dataloader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Real samples in the active loader's final global batch, or -1 when it divides evenly."""
        loader = self.active_dataloader
        return -1 if loader is None else int(loader.remainder)

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared dataloader is being iterated."""
        return self.active_dataloader is not None

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader: IteratedLoader) -> None:
        ref: LoaderRef
        try:
            ref = weakref.ref(dataloader)
        except TypeError:  # an object without weak-reference support is held as it is
            ref = functools.partial(_identity, dataloader)
        self._dataloader_references_ref.append(ref)
        self._active_dataloader_ref = ref

    def _remove_dataloader(self, dataloader: IteratedLoader) -> None:
        refs = self._dataloader_references_ref
        for i in range(len(refs) - 1, 0, -1):
            ref = refs[i]
            if ref is not None and ref() is dataloader:  # only refs[0] is None
                del refs[i]
                break
        self._active_dataloader_ref = refs[-1]

    def reach_batch_boundary(self) -> None:
        """Run and clear ``at_next_batch``: the loop is between two batches.

        Called by prepared dataloaders when asked for their next batch (before reading it) and by
        ``accumulate`` on entry, only while ``at_next_batch`` is set. At that point the loop body after
        the last step (the script's counters, progress bars, logging) has run and no batch of the next
        step has been taken.
        """
        hook, self.at_next_batch = self.at_next_batch, None
        if hook is not None:
            hook()

    @classmethod
    def _reset_state(cls) -> None:
        """Forget everything (tests and ``Accelerator.free_memory``)."""
        cls._shared_state.clear()

    def __repr__(self) -> str:
        return (
            f"GradientState(sync_gradients={self.sync_gradients}, num_steps={self.num_steps}, "
            f"end_of_dataloader={self.end_of_dataloader}, remainder={self.remainder})"
        )


def _identity(value: T) -> T:
    return value


def with_batch_boundaries(batches: Iterator[T]) -> Iterator[T]:
    """Yield ``batches``, reaching the batch boundary whenever the loop asks for the next one.

    A prepared dataloader wraps each iteration in it. The boundary is reached as the iteration starts
    and after each batch given out, when the loop asks for another (the last one included: the loop
    body of the epoch's last step has run then), before the underlying iterator is advanced. While
    nothing waits for a boundary (``at_next_batch`` unset, the usual case) each batch costs one dict
    lookup.

    Args:
        batches: the loader's own iterator over this epoch's batches; closed when this one is.

    Yields:
        The batches of ``batches``, unchanged.
    """
    shared = GradientState._shared_state
    try:
        if shared.get("at_next_batch") is not None:
            GradientState().reach_batch_boundary()
        for batch in batches:
            yield batch
            if shared.get("at_next_batch") is not None:
                GradientState().reach_batch_boundary()
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a loop that stopped early: the loader's own clean-up runs now
