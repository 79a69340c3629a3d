"""``Accelerator.save_state``'s entry point: a synchronous save, or an asynchronous one.

The commit protocol itself is :mod:`accelerando.checkpointing.save`; the background variant is
:mod:`accelerando.checkpointing.async_save`, built on it. This module only chooses between them, so
the protocol does not import its asynchronous caller.
"""

from __future__ import annotations

import os

from accelerando.checkpointing.async_save import save_state_async, wait_pending
from accelerando.checkpointing.save import _wait_for_lock, save_state_sync
from accelerando.checkpointing.target import CheckpointTarget

__all__ = ["save_state"]


def save_state(
    target: CheckpointTarget,
    output_dir: str | os.PathLike | None = None,
    safe_serialization: bool = True,
    **save_model_func_kwargs: object,
) -> str:
    """Save the complete training state crash-safely; ``Accelerator.save_state`` delegates here.

    Saves every prepared model, optimizer, scheduler and dataloader, the GradScaler, each process's
    random states and step counter, gradients of an unfinished accumulation cycle, and every object
    registered with ``register_for_checkpointing``. The folder appears only once complete.
    Save hooks (``register_save_state_pre_hook``) receive the hidden staging folder as their
    ``output_dir``; whatever they write there is verified and committed with the rest.

    One run writes into a project folder at a time: the first automatically named save locks the
    ``<project_dir>/checkpoints`` folder itself (no lock file) and holds the lock until the process ends
    or the Accelerator is freed; a save of another process into the same project is refused, or waits.

    Args:
        target: what to save (the Accelerator's :class:`~accelerando.checkpointing.target.CheckpointTarget`).
        output_dir: Destination folder; ignored with automatic checkpoint naming, which uses
            ``<project_dir>/checkpoints/checkpoint_<n>`` with ``n`` the ``iteration``, or the number
            after the newest existing ``checkpoint_<n>`` if that is higher (e.g. after a resume fell
            back from a damaged checkpoint).
        safe_serialization: Weights as safetensors (else ``torch.save``).
        **save_model_func_kwargs: ``wait_for_lock`` (seconds to wait while another process holds the
            folder's lock; default: the ``checkpoint_lock_wait`` setting where there is one, else
            ``accelerando.checkpointing.lock.WAIT_FOR_LOCK_S`` = 0, refuse at once), ``async_save``
            (default: ``project_configuration.async_save``; see
            :func:`accelerando.checkpointing.async_save.save_state_async`), ``overlap_snapshot`` (default
            True: with ``async_save``, the parameters and optimizer state are copied while the training
            goes on and the prepared optimizers' next ``step()`` waits for that copy; until then change
            the parameters only through them. False copies everything before returning), ``durable``
            (default: the ``checkpoint_durable`` setting, True unless ``ACCELERANDO_CHECKPOINT_DURABLE=0``,
            ``--checkpoint_durable false`` or the config key ``checkpoint_durable: false`` says otherwise:
            every file, the manifest and the renames are flushed to disk with ``fsync`` before
            ``save_state`` returns. False is a scratch save: the same atomic rename and manifest, without
            any ``fsync``, so a crashed process never leaves a half-written checkpoint that looks complete,
            but power loss may); the rest are accepted for API compatibility (engine-specific save
            options). A pending asynchronous save is waited for first.

    Returns:
        The committed checkpoint folder; with ``async_save`` an
        :class:`~accelerando.checkpointing.async_save.AsyncSaveHandle` whose ``result()`` returns it.

    Raises:
        ValueError: If no folder can be determined, ``iteration`` was set to an existing checkpoint's
            number, or ``wait_for_lock`` is negative.
        TypeError: If ``overlap_snapshot`` or ``durable`` is not True or False.
        CheckpointLockedError: If another process is saving into the folder (every process raises it).
        OSError: ``ENOSPC`` if the disk is full (nothing is committed, earlier checkpoints are untouched).
        CheckpointError: If a process failed to write its files (nothing is committed).
    """
    async_save = save_model_func_kwargs.pop("async_save", None)
    if async_save is None:
        async_save = getattr(target.project_configuration, "async_save", False)
    overlap = save_model_func_kwargs.pop("overlap_snapshot", True)
    if not isinstance(overlap, bool):
        raise TypeError(f"save_state(overlap_snapshot=...) takes True or False, not {overlap!r}")
    durable = _durable(target, save_model_func_kwargs.pop("durable", None))
    wait = _wait_for_lock(target, save_model_func_kwargs)
    del save_model_func_kwargs
    wait_pending(target.memory)  # one save at a time: the previous asynchronous one commits first
    if async_save:
        return save_state_async(  # type: ignore[return-value]
            target, output_dir, safe_serialization, wait, overlap=overlap, durable=durable
        )
    return save_state_sync(target, output_dir, safe_serialization, wait, durable)


def _durable(target: CheckpointTarget, value: object) -> bool:
    """``save_state(durable=...)``, else the ``checkpoint_durable`` setting, else True.

    Raises:
        TypeError: If the keyword is given and is not True or False.
    """
    if value is None:
        return target.settings.checkpoint_durable
    if not isinstance(value, bool):
        raise TypeError(
            f"save_state(durable=...) takes True or False, not {value!r}; durable=False skips the fsync "
            "calls (a scratch checkpoint, lost on power loss), True (the default) flushes every file."
        )
    return value
