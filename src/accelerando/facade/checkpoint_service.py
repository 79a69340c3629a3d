"""The checkpoint service: save / save_model / get_state_dict / save_state / load_state and their hooks.

The service owns the Accelerator's :class:`AcceleratorCheckpointTarget`, the view that
``accelerando.checkpointing`` reads (it never sees the Accelerator's private attributes).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch.utils.hooks import RemovableHandle

import accelerando.common as common
from accelerando.backends.strategies.base import Strategy
from accelerando.facade.context import ServiceContext
from accelerando.facade.observing import Observability
from accelerando.facade.registry import Stateful
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler
from accelerando.state import AcceleratorState

if TYPE_CHECKING:
    from accelerando.checkpointing.async_save import AsyncSaveHandle
    from accelerando.checkpointing.target import CheckpointMemory, CheckpointTarget
    from accelerando.core.settings import Settings
    from accelerando.plugins.project import ProjectConfiguration

__all__ = ["AcceleratorCheckpointTarget", "CheckpointService", "StepOwner"]


class StepOwner(Protocol):
    """The object the user holds (the Accelerator): checkpoints are kept per owner, and it counts micro-steps."""

    step: int


class AcceleratorCheckpointTarget:
    """The :class:`~accelerando.checkpointing.target.CheckpointTarget` of one Accelerator.

    Checkpointing reads the training's objects through this adapter, built from the services that
    hold them. Only ``owner`` and ``step`` reach back to the Accelerator, through a weak reference.
    """

    def __init__(self, owner: StepOwner, context: ServiceContext, observability: Observability) -> None:
        # Weak: the Accelerator holds this target, so a strong link back would keep both alive
        # after the user drops the Accelerator (until a garbage collection). The context holds no link
        # back either: a dropped Accelerator frees its prepared objects at once, without a gc pass.
        self._owner: Callable[[], StepOwner | None] = weakref.ref(owner)
        self._context = context
        self._observability = observability
        self._memory: CheckpointMemory | None = None
        self.warned_shared_fs = False

    def __getstate__(self) -> dict[str, object]:
        # A weak reference cannot be pickled: the Accelerator travels (once, through pickle's memo)
        # as a strong reference and becomes weak again on unpickling.
        state = dict(self.__dict__)
        state["_owner"] = self._owner()
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        owner = cast("StepOwner | None", state.pop("_owner"))
        self.__dict__.update(state)
        self._owner = (lambda: None) if owner is None else weakref.ref(owner)

    @property
    def owner(self) -> StepOwner:
        """The Accelerator this target reads.

        Raises:
            ReferenceError: the Accelerator no longer exists.
        """
        owner = self._owner()
        if owner is None:
            raise ReferenceError("The Accelerator of this checkpoint target no longer exists.")
        return owner

    @property
    def memory(self) -> CheckpointMemory:
        """What this Accelerator's checkpoints remember between calls: numbering, the pending
        asynchronous save, the project locks (made on first use: checkpointing loads with it).
        """
        if self._memory is None:
            from accelerando.checkpointing.target import CheckpointMemory

            self._memory = CheckpointMemory()
        return self._memory

    def release_locks(self) -> None:
        """Give up the project locks taken for this Accelerator (another run may then save there)."""
        if self._memory is not None:
            self._memory.release_locks()

    @property
    def models(self) -> list[torch.nn.Module]:
        """The prepared models."""
        return list(self._context.registry.models)

    @property
    def optimizers(self) -> list[AcceleratedOptimizer]:
        """The prepared optimizers."""
        return list(self._context.registry.optimizers)

    @property
    def schedulers(self) -> list[AcceleratedScheduler]:
        """The prepared schedulers."""
        return list(self._context.registry.schedulers)

    @property
    def dataloaders(self) -> list[torch.utils.data.DataLoader]:
        """The prepared dataloaders."""
        return list(self._context.registry.dataloaders)

    @property
    def custom_objects(self) -> list[Stateful]:
        """The objects registered for checkpointing."""
        return list(self._context.registry.custom_objects)

    @property
    def save_hooks(self) -> list[Callable[..., None]]:
        """The save_state pre-hooks."""
        return list(self._context.registry.save_hooks.values())

    @property
    def load_hooks(self) -> list[Callable[..., None]]:
        """The load_state pre-hooks."""
        return list(self._context.registry.load_hooks.values())

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The fp16 GradScaler, or None."""
        return self._context.precision.scaler

    @property
    def strategy(self) -> Strategy:
        """The strategy and its checkpoint hooks."""
        return self._context.strategy

    @property
    def state(self) -> AcceleratorState:
        """The process view."""
        return self._context.state

    @property
    def settings(self) -> Settings:
        """The resolved settings."""
        return self._context.settings

    @property
    def sync_gradients(self) -> bool:
        """False in the middle of an accumulation cycle."""
        return self._context.gradient_state.sync_gradients

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """Folders, rotation and iteration."""
        return self._context.options.project_configuration

    @property
    def step(self) -> int:
        """The Accelerator's micro-step counter."""
        return int(self.owner.step)

    @step.setter
    def step(self, value: int) -> None:
        self.owner.step = int(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (the Accelerator's ``gradient_accumulation_steps``)."""
        return int(self._context.gradient_state.num_steps)

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self._context.gradient_state.num_steps = int(value)

    @property
    def split_batches(self) -> bool:
        """Whether the dataloaders split one global batch between the processes."""
        return bool(self._context.options.dataloader_config.split_batches)

    def get_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of ``model``, as ``Accelerator.get_state_dict`` gives it."""
        return self._context.strategy.model_state_dict(model)

    def log_checkpoint(self, path: str, size: int) -> None:
        """Report a written checkpoint to the trackers, only with the ``log_checkpoint_metrics`` setting."""
        if self._context.settings.log_checkpoint_metrics:
            self._observability.log_checkpoint(path, size)


class CheckpointService:
    """Saves and restores the training of one Accelerator.

    Args:
        context: the Accelerator's shared services record: the registry (prepared and registered
            objects, the save/load hooks), the strategy (gathers sharded state dicts, writes and
            reads its own checkpoint files), the precision (its fp16 GradScaler is saved), the
            process view, the accumulation state, the settings (checksum verification...) and the
            options (the project configuration).
        owner: the object the user holds (the Accelerator): its ``step`` is saved and restored,
            and its lifetime bounds the project locks this service takes.
        observability: told about each written checkpoint (trackers).

    Attributes:
        target: what ``accelerando.checkpointing`` reads.
        resumed_from: the checkpoint ``auto_resume`` loaded, or None.
    """

    def __init__(self, context: ServiceContext, owner: StepOwner, observability: Observability) -> None:
        self.context = context
        self.registry = context.registry
        self.strategy = context.strategy
        self.state = context.state
        self.settings = context.settings
        self.options = context.options
        self.target = AcceleratorCheckpointTarget(owner, context, observability)
        # The target's ``step`` is a read/write property over the owner's counter; the protocol
        # declares it as a plain attribute, which pyright does not match with a property.
        self._target = cast("CheckpointTarget", self.target)
        self.resumed_from: str | None = None

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """Folders, checkpoint naming, rotation and the next checkpoint number."""
        return self.options.project_configuration

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """Return the full state dict of ``model`` (gathered from shards by strategies that shard).

        With ``unwrap=False`` the wrapper's own keys are kept (e.g. ``module.`` under DDP).

        Example:
            >>> state_dict = accelerator.get_state_dict(model)  # on every process (sharded models gather)
            >>> sorted(state_dict)
            ['bias', 'weight']
        """
        if not unwrap:
            return model.state_dict()
        return self.strategy.model_state_dict(model)

    def save(self, obj: object, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save ``obj`` to ``f`` once per job (once per machine with ``save_on_each_node``).

        Example:
            >>> accelerator.save({"epoch": 3}, "extra_state.pt")  # written by one process
        """
        # Through the package attribute: serialization loads on the first save, not with the Accelerator.
        common.serialization.save(
            obj,
            f,
            save_on_each_node=bool(self.project_configuration.save_on_each_node),
            safe_serialization=safe_serialization,
        )

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write ``model``'s weights into ``save_directory`` on the main process.

        Safetensors by default; above ``max_shard_size`` the weights are sharded with an index
        file; tied weights are stored once. Every process must call it (sharded strategies gather).

        Raises:
            ValueError: ``save_directory`` is a file.

        Example:
            >>> accelerator.save_model(model, "exported")  # exported/model.safetensors
        """
        from accelerando.backends.model_io import write_model_weights

        save_directory = os.fspath(save_directory)
        if os.path.isfile(save_directory):
            raise ValueError(f"save_directory {save_directory!r} is a file; pass a folder path")
        state_dict = self.get_state_dict(model)
        if self.state.is_main_process:
            write_model_weights(state_dict, save_directory, max_shard_size, safe_serialization)
        self.state._partial.wait_for_everyone()

    def register_for_checkpointing(self, *objects: Stateful) -> None:
        """Add objects with ``state_dict()`` / ``load_state_dict()`` to what ``save_state`` saves.

        With ``auto_resume``, objects registered after the first ``prepare()`` (which resumed) are
        restored right away from the checkpoint it resumed from: the ``i``-th registered object from its
        ``custom_checkpoint_<i>.pkl``, as ``load_state`` would have.

        Raises:
            ValueError: some objects lack those methods; the message lists each offender as
                ``Item at index <i>, `<type>```.
            FileNotFoundError: after an automatic resume, the checkpoint has no state for a newly
                registered object (it was saved with fewer objects); the message says how to order calls.
            CheckpointError: after an automatic resume, that state's file is damaged or unsafe.

        Example:
            >>> class StepCounter:
            ...     def __init__(self):
            ...         self.steps = 0
            ...     def state_dict(self):
            ...         return {"steps": self.steps}
            ...     def load_state_dict(self, state):
            ...         self.steps = state["steps"]
            >>> accelerator.register_for_checkpointing(StepCounter())  # saved and restored with the state
        """
        bad = [
            f"\t- Item at index {i}, `{type(o).__name__}`"
            for i, o in enumerate(objects)
            if not (
                callable(getattr(o, "state_dict", None)) and callable(getattr(o, "load_state_dict", None))
            )
        ]
        if bad:
            raise ValueError(
                "All `objects` must include a `state_dict` and `load_state_dict` function to be stored. "
                "The following inputs are invalid:\n" + "\n".join(bad)
            )
        custom = self.registry.custom_objects
        start = len(custom)
        custom.extend(objects)
        if self.resumed_from is not None:  # auto_resume already loaded: restore the late ones from there too
            from accelerando.checkpointing.load import restore_custom_objects

            restore_custom_objects(self._target, self.resumed_from, start)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Register ``hook(models, weights, output_dir)`` to run before ``save_state`` writes models.

        The hook may edit ``weights`` (or empty ``models``) to save models its own way.
        Returns a handle whose ``remove()`` unregisters it.

        Example:
            >>> def before_save(models, weights, output_dir):
            ...     print(f"saving {len(weights)} model(s)")
            >>> handle = accelerator.register_save_state_pre_hook(before_save)
            >>> handle.remove()
        """
        handle = RemovableHandle(self.registry.save_hooks)
        self.registry.save_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Register ``hook(models, input_dir)`` to run before ``load_state`` loads models.

        Example:
            >>> def before_load(models, input_dir):
            ...     print(f"loading {len(models)} model(s)")
            >>> handle = accelerator.register_load_state_pre_hook(before_load)
            >>> handle.remove()
        """
        handle = RemovableHandle(self.registry.load_hooks)
        self.registry.load_hooks[handle.id] = hook
        return handle

    def save_state(
        self, output_dir: str | None = None, safe_serialization: bool = True, **save_model_func_kwargs: object
    ) -> str | AsyncSaveHandle:
        """Save everything needed to resume into a crash-safe checkpoint folder; return its path.

        See ``accelerando.checkpointing.save_state`` for what is saved and the commit protocol. With
        ``async_save=True`` (or ``ProjectConfiguration(async_save=True)``) it returns once the state is
        copied to host memory, with a handle whose ``result()`` waits for the commit and returns the path.

        Example:
            >>> path = accelerator.save_state("checkpoint")  # models, optimizers, schedulers, RNG states
            >>> # later, or in a new run: accelerator.load_state("checkpoint")
        """
        from accelerando.checkpointing import save_state

        return save_state(
            self._target, output_dir, safe_serialization=safe_serialization, **save_model_func_kwargs
        )

    def load_state(
        self,
        input_dir: str | None = None,
        load_kwargs: dict[str, object] | None = None,
        **load_model_func_kwargs: object,
    ) -> None:
        """Restore a checkpoint written by ``save_state`` (the newest complete one when None).

        Args:
            input_dir: the checkpoint folder (None: the newest complete one, with automatic naming).
            load_kwargs: ``torch.load`` options for the checkpoint files, passed to the loader
                (``{"weights_only": False}`` opts in to fully unpickling trusted files).
            **load_model_func_kwargs: passed to each model's ``load_state_dict`` (e.g. ``strict=False``),
                see ``accelerando.checkpointing.load_state`` for the loader's own options.

        Raises:
            See ``accelerando.checkpointing.load_state`` (missing or damaged checkpoints, bad ``load_kwargs``).

        Example:
            >>> path = accelerator.save_state("checkpoint")
            >>> accelerator.load_state("checkpoint")  # model, optimizer, RNG states as they were saved
        """
        from accelerando.checkpointing import load_state
        from accelerando.checkpointing.async_save import wait_pending

        wait_pending(self.target.memory)  # a pending asynchronous save commits first
        if load_kwargs is not None:
            load_model_func_kwargs["load_kwargs"] = load_kwargs
        load_state(self._target, input_dir, **load_model_func_kwargs)
