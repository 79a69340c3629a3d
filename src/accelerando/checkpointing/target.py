"""What ``save_state`` / ``load_state`` see of the training they checkpoint: the CheckpointTarget.

Checkpointing never reads an Accelerator's private attributes: the facade hands it an object with
this shape (:class:`~accelerando.facade.checkpoint_service.AcceleratorCheckpointTarget`), and a test
can hand it any other object with the same members. Every checkpointing function that takes a
``target`` is typed against this protocol, so a member it reads that is not listed here is a type
error.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import torch

    from accelerando.core.settings import Settings
    from accelerando.plugins.project import ProjectConfiguration
    from accelerando.state import AcceleratorState

__all__ = [
    "CheckpointHooks",
    "CheckpointMemory",
    "CheckpointTarget",
    "LoadsOwnCheckpoints",
    "MemorySlot",
    "PendingSave",
    "Stateful",
]

_T = TypeVar("_T")


class MemorySlot(Generic[_T]):
    """One kind of thing a checkpointing module remembers per Accelerator, in its :class:`CheckpointMemory`.

    The module that owns the thing declares the slot once (``_BUFFERS = MemorySlot("...", _Buffers)``)
    and reads it with ``target.memory.get(_BUFFERS)``: the value lives and dies with the Accelerator,
    typed, with no module-level dictionary keyed by owners.

    Args:
        name: what is remembered (shown in ``repr``).
        factory: builds the value the first time it is asked for.
    """

    __slots__ = ("factory", "name")

    def __init__(self, name: str, factory: Callable[[], _T]) -> None:
        self.name = name
        self.factory = factory

    def __repr__(self) -> str:
        return f"MemorySlot({self.name!r})"


class Stateful(Protocol):
    """An object whose state a checkpoint holds: schedulers and registered custom objects."""

    def state_dict(self) -> object:
        """The object's state (any picklable value, usually a dict)."""
        ...

    # Any: implementations take the state they return (a scheduler's dict, ...), narrower than object.
    def load_state_dict(self, state: Any, /) -> object:
        """Restore what :meth:`state_dict` returned."""
        ...


class CheckpointHooks(Protocol):
    """What checkpointing uses of a strategy (``backends.strategies.base.Strategy``, a layer above).

    A strategy that writes its own checkpoint files (sharded layouts, engines) answers True from a
    ``save_*`` hook and reads them back in the ``load_*`` hook; False leaves the object to
    checkpointing's default files.

    A strategy whose ``load_*`` hooks restore every model and optimizer also inherits
    :class:`LoadsOwnCheckpoints`.

    Attributes:
        name: the strategy's name, for messages.
    """

    name: ClassVar[str]

    def save_model_checkpoint(
        self, model: torch.nn.Module, output_dir: str, index: int, safe_serialization: bool
    ) -> bool:
        """Write ``model``'s checkpoint the strategy's own way; False = checkpointing's default."""
        ...

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Load what ``save_model_checkpoint`` wrote; False = checkpointing's default."""
        ...

    def save_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, output_dir: str, index: int
    ) -> bool:
        """Write an optimizer's state the strategy's own way; False = checkpointing's default."""
        ...

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """Load what ``save_optimizer_checkpoint`` wrote; False = checkpointing's default."""
        ...

    def checkpoint_layout(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> dict[str, object]:
        """How ``save_state`` lays out models and optimizers (the manifest's ``extra["layout"]``)."""
        ...

    def plan_checkpoint_read(
        self, folder: str, layout: Mapping[str, object] | None, saved_world: int
    ) -> bool:
        """Before reading: True when ``folder`` (saved in ``layout``) loads through a conversion; raises
        ``CheckpointConversionError`` (one line) when no conversion exists.
        """
        ...

    def converts(self, folder: str) -> bool:
        """Whether a conversion was planned for ``folder``."""
        ...

    def read_converted_checkpoint(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Read the planned folder's models and optimizers and check them against the live ones."""
        ...

    def apply_converted_checkpoint(
        self, models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> None:
        """Apply what ``read_converted_checkpoint`` read."""
        ...


class LoadsOwnCheckpoints:
    """A strategy whose checkpoint loading restores every model and optimizer itself.

    Sharded strategies (FSDP, composable) and engines (DeepSpeed, Megatron-LM) write their own
    files and read them back: ``load_state`` then reads no full state dict for their models and
    optimizers (and checks their files rank by rank), and ``save_state`` in the middle of an
    accumulation cycle captures no gradients, which the strategy holds. The strategy lists this
    class before ``Strategy`` in its bases, so a hook it forgot fails loudly. A plain class, not an
    ABC (see the capabilities in ``backends/strategies/base.py``), declared here because checkpointing
    sits below the strategies.
    """

    def load_model_checkpoint(self, model: torch.nn.Module, input_dir: str, index: int) -> bool:
        """Restore ``model`` from what the strategy's ``save_model_checkpoint`` wrote into ``input_dir``.

        Raises:
            NotImplementedError: the strategy declares the capability without implementing it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement load_model_checkpoint")

    def load_optimizer_checkpoint(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None, input_dir: str, index: int
    ) -> bool:
        """Restore ``optimizer`` (of ``model``) from what the strategy's ``save_optimizer_checkpoint`` wrote.

        Raises:
            NotImplementedError: the strategy declares the capability without implementing it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement load_optimizer_checkpoint")


class PendingSave(Protocol):
    """An asynchronous save not waited for yet (``async_save.AsyncSaveHandle``)."""

    def result(self, timeout: float | None = None) -> str:
        """Wait for the commit and return the checkpoint folder (raising the save's error)."""
        ...


class CheckpointMemory:
    """What the checkpoints of one Accelerator remember between calls; its checkpoint service holds it.

    Per-process facts (the project locks this process holds, the background save's process group)
    stay in their modules; what belongs to one Accelerator lives here, so it goes with it.

    Attributes:
        token: names this run's staging folders and is recorded in its project lock.
        last_saved: number of the last automatically named checkpoint saved, or None.
        resumed: the resume point already accounted for in ``skipped`` (compared by identity).
        skipped: newer checkpoints the resume passed over (rotation leaves them alone).
        pending: the asynchronous save not waited for yet, or None.
        locks: the project locks taken for this Accelerator: path -> (fork generation, the
            finalizer that gives the lock up when the Accelerator is freed).
        committed: the latest folders this Accelerator committed: path -> (bytes, saved durably), at
            most ``COMMITTED_KEPT`` of them (a later save that replaces or rotates one out knows its
            size without reading its manifest).
    """

    COMMITTED_KEPT = 64

    def __init__(self) -> None:
        self.token: str = uuid.uuid4().hex
        self.last_saved: int | None = None
        self.resumed: object = None
        self.skipped: set[str] = set()
        self.pending: PendingSave | None = None
        self.locks: dict[str, tuple[int, weakref.finalize[..., object]]] = {}
        self.committed: dict[str, tuple[int, bool]] = {}
        self._slots: dict[object, object] = {}  # MemorySlot -> its value

    def get(self, slot: MemorySlot[_T]) -> _T:
        """The value of ``slot``, built by its factory the first time."""
        if slot not in self._slots:
            self._slots[slot] = slot.factory()
        return self._slots[slot]  # type: ignore[return-value]  # put there by slot's own factory or put()

    def peek(self, slot: MemorySlot[_T]) -> _T | None:
        """The value of ``slot`` if it was built or put, else None (nothing is built)."""
        return self._slots.get(slot)  # type: ignore[return-value]  # see get()

    def put(self, slot: MemorySlot[_T], value: _T) -> None:
        """Replace the value of ``slot``."""
        self._slots[slot] = value

    def remember_commit(self, folder: str, size: int, durable: bool) -> None:
        """Record a folder this Accelerator committed (see ``committed``)."""
        self.committed.pop(folder, None)
        self.committed[folder] = (size, durable)
        while len(self.committed) > self.COMMITTED_KEPT:
            del self.committed[next(iter(self.committed))]

    def release_locks(self) -> None:
        """Give up the project locks taken for this Accelerator (those no other owner still needs).

        Each lock's finalizer runs now instead of when the Accelerator is freed.
        """
        entries = list(self.locks.values())
        self.locks.clear()
        for _, finalizer in entries:
            finalizer()


class CheckpointTarget(Protocol):
    """The objects a checkpoint holds and how to reach them.

    Attributes:
        owner: the object the user holds (the Accelerator); resume points are kept per owner.
        memory: what its checkpoints remember between calls (:class:`CheckpointMemory`).
        models / optimizers / schedulers / dataloaders: the prepared objects, in preparation order.
        custom_objects: objects registered with ``register_for_checkpointing``.
        scaler: the fp16 GradScaler, or None.
        strategy: the strategy (its ``save_*_checkpoint`` / ``load_*_checkpoint`` hooks and
            whether it is a :class:`LoadsOwnCheckpoints`).
        state: the process view (``process_index``, ``num_processes``, ``is_main_process``, ...).
        project_configuration: the ``ProjectConfiguration`` (folders, rotation, iteration).
        settings: the resolved settings (``verify_checksums``).
        step: the micro-step counter; load_state writes it back.
        gradient_accumulation_steps: micro-batches per optimizer step; load_state changes it on
            another number of processes with ``elastic_batch="keep_global"``.
        split_batches: whether the dataloaders split one global batch between the processes.
        sync_gradients: False in the middle of an accumulation cycle.
        save_hooks / load_hooks: the user's ``register_save_state_pre_hook`` / ``..._load_...`` hooks.
        warned_shared_fs: whether the shared-file-system warning was given (written by checkpointing).
    """

    step: int
    gradient_accumulation_steps: int
    split_batches: bool
    warned_shared_fs: bool

    @property
    def owner(self) -> object:
        """The object the user holds (the Accelerator)."""
        ...

    @property
    def memory(self) -> CheckpointMemory:
        """What this Accelerator's checkpoints remember between calls (numbering, pending save, locks)."""
        ...

    @property
    def models(self) -> Sequence[torch.nn.Module]:
        """The prepared models, in preparation order."""
        ...

    @property
    def optimizers(self) -> Sequence[torch.optim.Optimizer]:
        """The prepared optimizers, in preparation order."""
        ...

    @property
    def schedulers(self) -> Sequence[Stateful]:
        """The prepared schedulers, in preparation order."""
        ...

    # Prepared dataloaders of several classes (shards, dispatchers, stateful loaders); checkpointing
    # asks each for what it has (``getattr``), so no one shape is promised.
    @property
    def dataloaders(self) -> Sequence[object]:
        """The prepared dataloaders, in preparation order."""
        ...

    @property
    def custom_objects(self) -> Sequence[Stateful]:
        """The objects registered with ``register_for_checkpointing``."""
        ...

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The fp16 GradScaler, or None."""
        ...

    @property
    def strategy(self) -> CheckpointHooks:
        """The strategy: its checkpoint hooks (a :class:`LoadsOwnCheckpoints` restores everything itself)."""
        ...

    @property
    def state(self) -> AcceleratorState:
        """The process view."""
        ...

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """Folders, rotation and iteration."""
        ...

    @property
    def settings(self) -> Settings:
        """The resolved settings."""
        ...

    @property
    def sync_gradients(self) -> bool:
        """False in the middle of an accumulation cycle."""
        ...

    @property
    def save_hooks(self) -> Sequence[Callable[..., None]]:
        """The user's save-state pre-hooks."""
        ...

    @property
    def load_hooks(self) -> Sequence[Callable[..., None]]:
        """The user's load-state pre-hooks."""
        ...

    def get_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of ``model`` (gathered from shards by sharding strategies)."""
        ...

    def log_checkpoint(self, path: str, size: int) -> None:
        """Tell the trackers a checkpoint was written (only with the ``log_checkpoint_metrics`` setting)."""
        ...
