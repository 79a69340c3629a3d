"""The registry of what an Accelerator prepared and what it checkpoints.

One object holds the prepared models, optimizers, schedulers and dataloaders (in preparation
order), the objects registered for checkpointing, the save/load hooks and the backend's engine
handle. The preparer fills it, the checkpoint service and ``free_memory`` read and empty it; the
Accelerator's ``_models`` / ``_optimizers`` / ``_schedulers`` / ``_dataloaders`` / ``_custom_objects``
are these very lists (the reference's attribute names, read by user code and transformers' Trainer).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import torch

from accelerando.backends.strategies.base import Prepared
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler

__all__ = ["PreparedObjects", "Stateful"]


class Stateful(Protocol):
    """An object ``save_state`` can checkpoint: it has ``state_dict()`` and ``load_state_dict()``."""

    def state_dict(self) -> object:
        """The object's state."""
        ...

    # A read-only member typed as a callable taking anything: a user's method takes the state it
    # returns (``dict[str, int]``, ...), narrower than ``object``, and a method with a parameter of
    # type ``object`` made pyright refuse ``register_for_checkpointing(counter)`` in users' scripts.
    @property
    def load_state_dict(self) -> Callable[..., object]:
        """Restore a ``state_dict()`` result."""
        ...


class PreparedObjects:
    """Everything one Accelerator prepared or registered, in the order it came.

    Attributes:
        models: prepared models (wrapped: DDP, FSDP, engines...).
        optimizers: ``AcceleratedOptimizer`` wrappers.
        schedulers: ``AcceleratedScheduler`` wrappers.
        dataloaders: prepared dataloaders.
        custom_objects: objects registered with ``register_for_checkpointing``.
        save_hooks / load_hooks: ``register_save_state_pre_hook`` / ``..._load_...`` hooks by handle id.
        engine: the backend's engine handle (``deepspeed_engine_wrapped``), or None.
        after_optimizer_step: called after every real optimizer step of every prepared optimizer
            (the memory monitor's sampler), or None.
    """

    def __init__(self) -> None:
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[AcceleratedOptimizer] = []
        self.schedulers: list[AcceleratedScheduler] = []
        self.dataloaders: list[torch.utils.data.DataLoader] = []
        self.custom_objects: list[Stateful] = []
        self.save_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self.load_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self.engine: object | None = None
        self.after_optimizer_step: Callable[[], object] | None = None

    def holds(self, obj: object) -> bool:
        """Whether ``obj`` is one of the prepared models, optimizers or schedulers (by identity)."""
        return any(obj is p for p in (*self.models, *self.optimizers, *self.schedulers))

    def add(self, prepared: Prepared) -> None:
        """Register what a strategy's ``prepare_all`` made (models, optimizers, schedulers, engine)."""
        self.models.extend(prepared.models)
        self.optimizers.extend(prepared.optimizers)
        self.schedulers.extend(prepared.schedulers)
        if prepared.engine is not None:
            self.engine = prepared.engine

    def set_after_optimizer_step(self, hook: Callable[[], object] | None) -> None:
        """Call ``hook`` after every real step of every prepared optimizer, present and future (None: stop)."""
        self.after_optimizer_step = hook
        for optimizer in self.optimizers:
            optimizer._after_step = hook

    def clear(self) -> None:
        """Forget the prepared models, optimizers, schedulers and dataloaders (registered objects stay)."""
        self.models.clear()
        self.optimizers.clear()
        self.schedulers.clear()
        self.dataloaders.clear()
