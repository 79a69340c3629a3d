"""What ``save_state`` / ``load_state`` see of the training they checkpoint: the CheckpointTarget.

Checkpointing never reads an Accelerator's private attributes: the facade hands it an object with
this shape (:class:`~accelerando.facade.saving.AcceleratorCheckpointTarget`), and a test can hand it
any other object with the same members.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["CheckpointTarget"]


class CheckpointTarget(Protocol):
    """The objects a checkpoint holds and how to reach them.

    Attributes:
        owner: the object the user holds (the Accelerator); resume points are kept per owner.
        models / optimizers / schedulers / dataloaders: the prepared objects, in preparation order.
        custom_objects: objects registered with ``register_for_checkpointing``.
        scaler: the fp16 GradScaler, or None.
        strategy: the strategy (its ``save_*_checkpoint`` / ``load_*_checkpoint`` hooks and
            ``loads_own_checkpoints``).
        state: the process view (``process_index``, ``num_processes``, ``is_main_process``, ...).
        project_configuration: the ``ProjectConfiguration`` (folders, rotation, iteration).
        settings: the resolved settings (``verify_checksums``).
        step: the micro-step counter; load_state writes it back.
        sync_gradients: False in the middle of an accumulation cycle.
        save_hooks / load_hooks: the user's ``register_save_state_pre_hook`` / ``..._load_...`` hooks.
        warned_shared_fs: whether the shared-file-system warning was given (written by checkpointing).
    """

    owner: Any
    custom_objects: Sequence[Any]
    scaler: Any
    strategy: Any
    state: Any
    project_configuration: Any
    settings: Any
    step: int
    warned_shared_fs: bool

    @property
    def models(self) -> Sequence[Any]: ...

    @property
    def optimizers(self) -> Sequence[Any]: ...

    @property
    def schedulers(self) -> Sequence[Any]: ...

    @property
    def dataloaders(self) -> Sequence[Any]: ...

    @property
    def sync_gradients(self) -> bool: ...

    @property
    def save_hooks(self) -> Sequence[Callable[..., None]]: ...

    @property
    def load_hooks(self) -> Sequence[Callable[..., None]]: ...

    def get_state_dict(self, model: Any) -> dict[str, Any]:
        """The full state dict of ``model`` (gathered from shards by sharding strategies)."""
        ...

    def log_checkpoint(self, step: int, path: str, size: int) -> None:
        """Tell the trackers a checkpoint was written (a no-op without trackers)."""
        ...
