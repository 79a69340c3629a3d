"""Gradient accumulation around one micro-batch (``Accelerator.accumulate``) and uneven inputs.

The :class:`Accumulation` context is on the per-micro-batch hot path: it is a plain class with
slots (no generator, no ``ExitStack`` for one model) and reads the Accelerator's attributes
directly; ``tests/facade/test_hot_path_calls.py`` counts its Python-level calls.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from accelerando.core.gradient_state import GradientState

if TYPE_CHECKING:
    from accelerando.backends.strategies.base import Strategy
    from accelerando.facade.preemption import PendingSave, PreemptionWatch
    from accelerando.state import AcceleratorState

__all__ = ["Accumulating", "Accumulation", "override_even_batches"]


class Accumulating(Protocol):
    """What :class:`Accumulation` reads of the Accelerator (its training-step attributes)."""

    @property
    def gradient_state(self) -> GradientState:
        """The accumulation state (``sync_gradients``, ``sync_each_batch``)."""
        ...

    @property
    def _strategy(self) -> Strategy: ...

    @property
    def _preemption(self) -> PreemptionWatch | None: ...

    @property
    def state(self) -> AcceleratorState:
        """The process view (``num_processes``)."""
        ...

    def _do_sync(self) -> None: ...

    @property
    def is_main_process(self) -> bool:
        """True on the process of global index 0."""
        ...

    def save_state(self) -> str | PendingSave:
        """Save the training state (what a preemption does before exiting)."""
        ...

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        ...


class Accumulation:
    """``Accelerator.accumulate``'s context: a plain class, as it is entered once per micro-batch."""

    __slots__ = ("_accelerator", "_models", "_stack")

    def __init__(self, accelerator: Accumulating, models: tuple[torch.nn.Module, ...]) -> None:
        self._accelerator = accelerator
        self._models = models
        self._stack: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> None:
        accelerator = self._accelerator
        gs = accelerator.gradient_state
        if gs.at_next_batch is not None:  # e.g. a preemption checkpoint agreed at the last step's end
            gs.reach_batch_boundary()
        accelerator._do_sync()
        if gs.sync_gradients or gs.sync_each_batch or not self._models:
            return
        strategy = accelerator._strategy
        if len(self._models) == 1:
            context = strategy.no_sync(self._models[0])
            context.__enter__()
            self._stack = context
            return
        stack = contextlib.ExitStack()
        try:
            for model in self._models:
                stack.enter_context(strategy.no_sync(model))
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        stack, self._stack = self._stack, None
        if stack is not None and stack.__exit__(exc_type, exc, tb):
            return True  # a no_sync context swallowed the exception, as it would inside ExitStack
        if exc_type is None:
            # The step is complete here (reached only without an exception): the processes agree on
            # a preemption now, and checkpoint at the next batch boundary, once the loop body after
            # this block (the script's step counter, progress bar, logging) has run.
            accelerator = self._accelerator
            preemption = accelerator._preemption
            if preemption is not None and preemption.should_stop(accelerator.state.num_processes):
                # Deferred: a watch exists only if the preemption module was loaded to install it.
                from accelerando.facade.preemption import checkpoint_at_next_batch

                checkpoint_at_next_batch(accelerator, preemption)
        return False


@runtime_checkable
class EvenBatches(Protocol):
    """A batch sampler whose ``even_batches`` decides how the last batches are shared."""

    even_batches: bool


def override_even_batches(
    dataloaders: Sequence[object], even_batches: bool | None
) -> list[tuple[EvenBatches, bool]]:
    """Set ``even_batches`` on each map-style loader's batch sampler; return (sampler, old value) pairs.

    Only the batch sampler decides how the last batches are shared, so that is where the value
    goes. Loaders over iterable datasets (or dispatching loaders) are skipped with a warning.
    """
    if even_batches is None:
        return []
    # Here, not at the top: the data loader package is 10 modules the first Accelerator does not need.
    from accelerando.data_loader.dispatcher import DataLoaderDispatcher

    overridden: list[tuple[EvenBatches, bool]] = []
    skipped = False
    for dl in dataloaders:
        sampler: object = getattr(dl, "batch_sampler", None)  # any batch sampler with ``even_batches``
        if not isinstance(dl, DataLoaderDispatcher) and isinstance(sampler, EvenBatches):
            overridden.append((sampler, sampler.even_batches))
            sampler.even_batches = even_batches
        else:
            skipped = True
    if skipped:
        warnings.warn(
            "join_uneven_inputs(even_batches=...) only changes dataloaders over map-style datasets; "
            "some prepared dataloaders read iterable datasets and keep their even_batches",
            stacklevel=3,
        )
    return overridden
