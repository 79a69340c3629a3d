"""``Accelerator.save_state``: the multi-process commit protocol.

Every process runs this, in this order:
1. the committing process (main, or each node's local main with ``save_on_each_node``) clears
   leftovers of interrupted saves and creates the hidden staging folder; barrier;
2. every process writes its files into the staging folder, flushes them to disk and computes their
   size and checksum; the results (or a failure) are gathered on every process, which is the barrier
   that guarantees every rank's files are in place;
3. the committing process writes the manifest and renames the folder into place, then rotates old
   checkpoints (only now, so a crash never costs a complete checkpoint); barrier.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import accelerando.checkpointing.atomic as atomic
from accelerando.checkpointing.collective import gather, is_committer, save_on_each_node
from accelerando.checkpointing.project import checkpoints_dir, owns_loading
from accelerando.checkpointing.public import save_custom_state
from accelerando.checkpointing.state_io import (
    capture_gradients,
    write_state_files,
)
from accelerando.runtime import set_active_accelerator

__all__ = ["save_state"]

logger = logging.getLogger(__name__)


def _resolve_save_dir(target: Any, output_dir: str | os.PathLike | None) -> tuple[str, str | None]:
    """``(final folder, checkpoints folder or None)`` for a save."""
    config = target.project_configuration
    if config.automatic_checkpoint_naming:
        root = checkpoints_dir(target)
        final = os.path.join(root, f"checkpoint_{config.iteration}")
        if output_dir is not None and os.path.abspath(output_dir) != os.path.abspath(final):
            logger.warning("automatic_checkpoint_naming is on: saving to %s instead of %s", final, output_dir)
        if os.path.exists(final):
            raise ValueError(
                f"Checkpoint folder {final!r} already exists (iteration {config.iteration}). Call "
                "accelerator.load_state() first to resume (it sets the iteration), or set "
                "accelerator.project_configuration.iteration to the next free number."
            )
        return os.path.abspath(final), root
    if output_dir is None:
        raise ValueError(
            "save_state() needs output_dir= unless automatic checkpoint naming is on; pass a folder, or "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return os.path.abspath(os.fspath(output_dir)), None


def _mid_accumulation(target: Any) -> bool:
    """Whether gradients of an unfinished accumulation cycle are pending."""
    return not bool(target.sync_gradients)


def _write_process_files(
    target: Any,
    staging: str,
    safe_serialization: bool,
    each_node: bool,
    on_written: Callable[[str], None],
) -> None:
    """Write this process's files into the staging folder, handing each name to ``on_written``."""
    models = list(target.models)
    optimizers = list(target.optimizers)
    strategy = target.strategy
    # Sharded strategies (FSDP, DeepSpeed) write their own per-process files on every process;
    # whatever they handle is left out of the files written below (None entries are skipped).
    weights: list[Any] = []
    for i, model in enumerate(models):
        own = strategy is not None and strategy.save_model_checkpoint(model, staging, i, safe_serialization)
        weights.append(None if own else target.get_state_dict(model))
    for i, optimizer in enumerate(optimizers):
        owner = models[i] if i < len(models) else None
        if strategy is not None and strategy.save_optimizer_checkpoint(optimizer, owner, staging, i):
            optimizers[i] = None
    for hook in target.save_hooks:
        hook(models, weights, staging)
    grads = None
    if _mid_accumulation(target):
        if not owns_loading(target):
            grads = capture_gradients(models)
        elif target.state.is_main_process:
            warnings.warn(
                f"save_state() ran in the middle of a gradient accumulation cycle under {strategy.name}: the "
                "gradients accumulated so far are held by the strategy and are not in the checkpoint, so a "
                "run resumed from it will not continue bit-exactly. Save when accelerator.sync_gradients is "
                "True (right after the optimizer step of a full cycle).",
                stacklevel=4,
            )
    write_state_files(
        staging,
        weights,
        optimizers,
        list(target.schedulers),
        list(target.dataloaders),
        target.state.process_index,
        int(target.step),
        scaler=target.scaler,
        save_on_each_node=each_node,
        safe_serialization=safe_serialization,
        gradients=grads,
        on_written=on_written,
    )
    for i, obj in enumerate(target.custom_objects):
        written = save_custom_state(obj, staging, i, each_node)
        if written is not None:
            on_written(os.path.basename(written))


def _commit_staged(target: Any, staging: str, final_dir: str, results: list[Any]) -> int:
    """Committing process: manifest + atomic rename. Returns the checkpoint's size in bytes."""
    entries: dict[str, atomic.FileEntry] = {}
    for _, _, described in results:
        entries.update(described)
    # With save_on_each_node (no shared file system) only this node's files are here to commit.
    entries = {name: entry for name, entry in entries.items() if os.path.exists(os.path.join(staging, name))}
    # Files written by save hooks belong to the checkpoint too.
    extra = []
    for root, _, filenames in os.walk(staging):
        if root != staging:
            atomic.fsync_dir(root)  # a hook's sub-folder: make its entries durable too
        for filename in filenames:
            rel = os.path.relpath(os.path.join(root, filename), staging)
            if rel not in entries and rel != atomic.MANIFEST_NAME:
                extra.append(rel)
    entries.update(atomic.describe_files(staging, extra))
    from accelerando.version import __version__

    config = target.project_configuration
    manifest = atomic.Manifest(
        files=entries,
        world_size=int(target.state.num_processes),
        library_version=__version__,
        extra={"step": int(target.step), "iteration": int(config.iteration)},
    )
    atomic.commit(staging, final_dir, manifest)
    return sum(entry.size for entry in entries.values())


def _write_everywhere(
    target: Any, staging: str, final_dir: str, safe_serialization: bool, committer: bool, each_node: bool
) -> list[Any]:
    """Every process writes and describes its files; all learn whether every process succeeded.

    Returns:
        ``[(rank, None, entries), ...]`` for every process.

    Raises:
        The local error, or ``CheckpointError`` naming the failed process (the staging is discarded).
    """
    state = target.state
    error: BaseException | None = None
    described: dict[str, atomic.FileEntry] = {}
    describer = atomic.FileDescriber(staging)  # flushes and hashes each file while the next is written
    try:
        _write_process_files(target, staging, safe_serialization, each_node, describer.add)
        described = describer.finish()
    except Exception as err:  # noqa: BLE001 - reported to every process below
        error = err
    finally:
        describer.close()
    report = None if error is None else f"{type(error).__name__}: {error}"
    results = gather((state.process_index, report, described), state.num_processes)
    failed = [(rank, msg) for rank, msg, _ in results if msg is not None]
    if failed:
        if committer:
            atomic.discard(staging)
        if error is not None:
            raise error
        raise atomic.CheckpointError(f"Process {failed[0][0]} failed to write {final_dir!r}: {failed[0][1]}")
    return results


def save_state(
    target: Any,
    output_dir: str | os.PathLike | None = None,
    safe_serialization: bool = True,
    **save_model_func_kwargs: Any,
) -> str:
    """Save the complete training state crash-safely; ``Accelerator.save_state`` delegates here.

    Saves every prepared model, optimizer, scheduler and dataloader, the GradScaler, each process's
    random states and step counter, gradients of an unfinished accumulation cycle, and every object
    registered with ``register_for_checkpointing``. The folder appears only once complete.
    Save hooks (``register_save_state_pre_hook``) receive the hidden staging folder as their
    ``output_dir``; whatever they write there is verified and committed with the rest.

    Args:
        target: what to save (the Accelerator's :class:`~accelerando.checkpointing.target.CheckpointTarget`).
        output_dir: Destination folder; ignored with automatic checkpoint naming, which uses
            ``<project_dir>/checkpoints/checkpoint_<iteration>``.
        safe_serialization: Weights as safetensors (else ``torch.save``).
        **save_model_func_kwargs: Accepted for API compatibility (engine-specific save options).

    Returns:
        The committed checkpoint folder.

    Raises:
        ValueError: If no folder can be determined or the automatic folder already exists.
        CheckpointError: If a process failed to write its files (nothing is committed).
    """
    del save_model_func_kwargs
    set_active_accelerator(target.owner)
    state = target.state
    config = target.project_configuration
    final_dir, checkpoints_dir = _resolve_save_dir(target, output_dir)
    each_node = save_on_each_node(target, final_dir)
    committer = is_committer(state, each_node)
    if committer:
        prefix = "checkpoint_" if checkpoints_dir is not None else os.path.basename(final_dir) + "."
        atomic.remove_stale(os.path.dirname(final_dir), prefix)
        atomic.prepare_staging(final_dir)
    state.wait_for_everyone()
    staging = atomic.staging_path(final_dir)
    results = _write_everywhere(target, staging, final_dir, safe_serialization, committer, each_node)
    size = 0
    if committer:
        size = _commit_staged(target, staging, final_dir, results)
        if checkpoints_dir is not None:
            atomic.rotate(checkpoints_dir, config.total_limit)
    state.wait_for_everyone()
    if config.automatic_checkpoint_naming:
        config.iteration += 1
    _report_to_trackers(target, final_dir, size)
    return final_dir


def _report_to_trackers(target: Any, path: str, size: int) -> None:
    """Report a committed checkpoint (step, path, size) to the active trackers, on the main process."""
    if not target.state.is_main_process:
        return
    target.log_checkpoint(int(target.step), path, size)
