"""``Accelerator.save_state`` / ``load_state``: the multi-process commit protocol and auto-resume.

Save (every process runs this, in this order):
1. the committing process (main, or each node's local main with ``save_on_each_node``) clears
   leftovers of interrupted saves and creates the hidden staging folder; barrier;
2. every process writes its files into the staging folder, flushes them to disk and computes their
   size and checksum; the results (or a failure) are gathered on every process, which is the barrier
   that guarantees every rank's files are in place;
3. the committing process writes the manifest and renames the folder into place, then rotates old
   checkpoints (only now, so a crash never costs a complete checkpoint); barrier.

Load verifies first (sizes always; checksums by default, every file's pieces hashed in parallel), reads,
agrees across processes that every rank succeeded, and only then applies it to the live objects.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import accelerando.checkpointing.atomic as atomic
import accelerando.checkpointing.files as F
from accelerando.checkpointing.collective import gather, is_committer, save_on_each_node
from accelerando.checkpointing.public import save_custom_state
from accelerando.checkpointing.state_io import (
    LoadedState,
    apply_state,
    capture_gradients,
    check_load_kwargs,
    needed_files,
    read_state_files,
    write_state_files,
)
from accelerando.runtime import set_active_accelerator

__all__ = [
    "CHECKPOINTS_FOLDER",
    "ResumePoint",
    "latest_checkpoint",
    "load_state",
    "resume_point",
    "save_state",
]

logger = logging.getLogger(__name__)

CHECKPOINTS_FOLDER = "checkpoints"
_NUMBERED = re.compile(r"^checkpoint_(\d+)$")
_RESUME_POINTS: weakref.WeakKeyDictionary[Any, ResumePoint] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ResumePoint:
    """Where a run stands after ``load_state``: what an auto-resuming script needs to continue.

    Attributes:
        checkpoint: The folder that was loaded.
        step: The accelerator's micro-step counter (``accelerator.step``) at the save.
        epoch: Epoch of the first prepared dataloader at the save (0 without dataloaders).
        batches_to_skip: Batches of that epoch already consumed, which the script must skip with
            ``accelerator.skip_first_batches``; 0 in stateful mode, where the loader itself resumes.
        dataloaders: ``(epoch, position)`` saved for every prepared dataloader, in order.
    """

    checkpoint: str
    step: int
    epoch: int = 0
    batches_to_skip: int = 0
    dataloaders: tuple[tuple[int, int], ...] = ()


def _checkpoints_dir(target: Any) -> str:
    project_dir = target.project_configuration.project_dir
    if project_dir is None:
        raise ValueError(
            "automatic_checkpoint_naming needs a project folder; pass project_dir= to Accelerator or "
            "ProjectConfiguration(project_dir=...)."
        )
    return os.path.join(os.fspath(project_dir), CHECKPOINTS_FOLDER)


def _resolve_save_dir(target: Any, output_dir: str | os.PathLike | None) -> tuple[str, str | None]:
    """``(final folder, checkpoints folder or None)`` for a save."""
    config = target.project_configuration
    if config.automatic_checkpoint_naming:
        root = _checkpoints_dir(target)
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


def _owns_loading(target: Any) -> bool:
    """Whether the strategy restores models and optimizers itself (sharded layouts)."""
    return bool(getattr(target.strategy, "loads_own_checkpoints", False))


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
        if not _owns_loading(target):
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


def latest_checkpoint(project_dir: str | os.PathLike) -> str | None:
    """Newest complete checkpoint folder under ``<project_dir>/checkpoints``, or None.

    Complete means committed (it has a manifest); damage is found when loading.

    Args:
        project_dir: The run's project folder.

    Returns:
        The folder path, or None when there is none (a fresh run).
    """
    found = atomic.list_checkpoints(os.path.join(os.fspath(project_dir), CHECKPOINTS_FOLDER))
    return found[-1][1] if found else None


def _candidates(target: Any, input_dir: str | os.PathLike | None) -> tuple[list[str], bool]:
    """Folders to try, newest first, and whether falling back to an older one is allowed."""
    if input_dir is not None:
        folder = os.path.abspath(os.fspath(input_dir))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"Cannot load state: {folder!r} is not a folder; check the path.")
        return [folder], False
    if not target.project_configuration.automatic_checkpoint_naming:
        raise ValueError(
            "load_state() needs input_dir= unless automatic checkpoint naming is on; pass the checkpoint "
            "folder, or use ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    root = _checkpoints_dir(target)
    found = [path for _, path in reversed(atomic.list_checkpoints(root))]
    newest = os.path.basename(found[0]) if found else None
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        match = _NUMBERED.match(name)
        if match and (newest is None or int(match.group(1)) > int(newest.split("_")[1])):
            if not os.path.exists(os.path.join(root, name, atomic.MANIFEST_NAME)):
                warnings.warn(
                    f"Skipping incomplete checkpoint {os.path.join(root, name)}: it has no manifest",
                    stacklevel=3,
                )
    if not found:
        raise FileNotFoundError(
            f"No complete checkpoint under {root!r} to resume from; start fresh (see "
            "accelerando.checkpointing.latest_checkpoint to test for one first)."
        )
    return found, True


def _read_candidate(
    target: Any,
    folder: str,
    models: list[Any],
    map_location: Any,
    verify_checksums: bool,
    allow_unverified: bool,
) -> tuple[LoadedState, list[Any], bool]:
    """Read and verify one folder for this process. Returns (state, custom states, per-rank parts loaded)."""
    state = target.state
    manifest = None
    if allow_unverified and not os.path.exists(os.path.join(folder, atomic.MANIFEST_NAME)):
        logger.warning("%s has no %s: loading it without verification", folder, atomic.MANIFEST_NAME)
    else:
        manifest = atomic.verify_checkpoint(folder)  # sizes of every file
    per_rank = manifest is None or manifest.world_size == state.num_processes
    if not per_rank:
        warnings.warn(
            f"{folder} was saved by {manifest.world_size} processes and is loaded by {state.num_processes}: "
            "models, optimizers, schedulers, the scaler and custom objects are restored; random states, "
            "dataloader positions and unfinished-accumulation gradients are per process and are NOT "
            "restored, so the run will not continue bit-exactly.",
            stacklevel=3,
        )
    loaders = list(target.dataloaders) if per_rank else []
    owns = _owns_loading(target)  # then models and optimizers are read by the strategy in _apply
    counts = (
        0 if owns else len(models),
        0 if owns else len(target.optimizers),
        len(target.schedulers),
        len(loaders),
        state.process_index,
        target.scaler is not None,
    )
    customs = [f"{F.CUSTOM_NAME}_{i}.pkl" for i in range(len(target.custom_objects))]
    names = needed_files(folder, *counts, per_rank=per_rank) + customs
    if manifest and verify_checksums:
        # Before reading: a damaged file is named by its checksum, not by whatever parse error it causes.
        atomic.verify_checksums(folder, manifest, names)
    loaded = read_state_files(folder, *counts, map_location=map_location, per_rank=per_rank)
    custom_states = [F.torch_load(_custom_path(folder, name)) for name in customs]
    return loaded, custom_states, per_rank


def _custom_path(folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"Checkpoint {folder!r} has no {name!r}: fewer objects were registered with "
            "register_for_checkpointing when it was saved; register the same objects in the same order."
        )
    return path


def _attempt(target: Any, folder: str, kwargs: dict[str, Any]) -> Any:
    """Try one folder on every process; returns the read state or the local error, plus everyone's verdict."""
    models = list(target.models)
    for hook in target.load_hooks:
        hook(models, folder)
    outcome: Any
    error: BaseException | None = None
    try:
        outcome = (
            models,
            *_read_candidate(
                target,
                folder,
                models,
                kwargs["map_location"],
                kwargs["verify_checksums"],
                kwargs["allow_unverified"],
            ),
        )
    except Exception as err:  # noqa: BLE001 - every process must learn of it before anyone raises
        outcome, error = None, err
    report = None if error is None else (f"{type(error).__name__}: {error}", _is_damage(error))
    verdicts = gather((target.state.process_index, report), target.state.num_processes)
    return outcome, error, [(rank, *rep) for rank, rep in verdicts if rep is not None]


def _is_damage(error: BaseException) -> bool:
    """Whether a load error means a damaged file (fall back) rather than a bug or a mismatch (raise)."""
    import pickle

    damage: tuple[type[BaseException], ...] = (
        atomic.CheckpointError,
        EOFError,
        pickle.UnpicklingError,
        OSError,
    )
    try:
        from safetensors import SafetensorError

        damage += (SafetensorError,)
    except ImportError:  # pragma: no cover - safetensors is a dependency
        pass
    if isinstance(error, FileNotFoundError):
        return True
    # torch.load reports a corrupted zip archive as a RuntimeError from its stream reader.
    return isinstance(error, damage) or (
        isinstance(error, RuntimeError) and "PytorchStreamReader" in str(error)
    )


def load_state(
    target: Any, input_dir: str | os.PathLike | None = None, **load_model_func_kwargs: Any
) -> None:
    """Restore everything ``save_state`` saved; ``Accelerator.load_state`` delegates here.

    Without ``input_dir`` (automatic checkpoint naming), resumes from the newest complete checkpoint
    under ``<project_dir>/checkpoints``, skipping damaged ones with a warning, and sets
    ``project_configuration.iteration`` to the number after it. Nothing is applied unless every
    process read and verified its files.

    Args:
        target: what to restore into (the Accelerator's ``CheckpointTarget``).
        input_dir: Checkpoint folder (None: the newest complete one, with automatic naming).
        **load_model_func_kwargs: Passed to each model's ``load_state_dict`` (e.g. ``strict=False``),
            except ``map_location`` (device for loaded weights, default CPU), ``verify_checksums``
            (default: the ``verify_checksums`` setting, True unless ``ACCELERANDO_VERIFY_CHECKSUMS=0`` or
            the config file says otherwise: compare every read file's checksum with the manifest; sizes
            are always checked) and ``allow_unverified`` (default False: an explicit folder without a manifest,
            e.g. written by another library, is loaded with a warning instead of refused).

    Raises:
        FileNotFoundError: If the folder does not exist, or no checkpoint exists to resume from.
        ValueError: If no folder is given and automatic naming is off.
        CheckpointError: If the checkpoint is damaged (explicit folder) or every candidate is.
    """
    set_active_accelerator(target.owner)
    check_load_kwargs(load_model_func_kwargs.pop("load_kwargs", None))
    candidates, may_fall_back = _candidates(target, input_dir)
    kwargs = {
        "map_location": load_model_func_kwargs.pop("map_location", None),
        "verify_checksums": bool(
            load_model_func_kwargs.pop("verify_checksums", _default_verification(target))
        ),
        "allow_unverified": bool(load_model_func_kwargs.pop("allow_unverified", False)) and not may_fall_back,
    }
    for folder in candidates:
        outcome, error, failed = _attempt(target, folder, kwargs)
        if not failed:
            _apply(target, folder, outcome, load_model_func_kwargs)
            return
        if not may_fall_back or not all(is_damage for _, _, is_damage in failed):
            if error is not None:
                raise error
            raise atomic.CheckpointError(f"Process {failed[0][0]} could not load {folder!r}: {failed[0][1]}")
        logger.warning("Skipping checkpoint %s: %s", folder, failed[0][1])
        warnings.warn(f"Skipping damaged checkpoint {folder}: {failed[0][1]}", stacklevel=2)
    raise atomic.CheckpointError(
        f"Every checkpoint under {os.path.dirname(candidates[0])!r} is damaged; nothing was loaded. "
        "Start fresh or repair one (the warnings above name the damaged files)."
    )


def _default_verification(target: Any) -> bool:
    """The ``verify_checksums`` setting (code > launcher > ACCELERANDO_VERIFY_CHECKSUMS > config > True)."""
    value = getattr(target.settings, "verify_checksums", None)
    return True if value is None else bool(value)


def _apply(target: Any, folder: str, outcome: Any, model_kwargs: dict[str, Any]) -> None:
    models, loaded, custom_states, per_rank = outcome
    optimizers = list(target.optimizers)
    if _owns_loading(target):
        strategy = target.strategy
        for i, model in enumerate(models):
            if not strategy.load_model_checkpoint(model, folder, i):
                raise FileNotFoundError(f"{folder!r}: the {strategy.name} strategy could not load model {i}")
        for i, optimizer in enumerate(optimizers):
            owner = models[i] if i < len(models) else None
            if not strategy.load_optimizer_checkpoint(optimizer, owner, folder, i):
                raise FileNotFoundError(
                    f"{folder!r}: the {strategy.name} strategy could not load optimizer {i}"
                )
        models, optimizers = [], []
    apply_state(
        loaded,
        models,
        optimizers,
        list(target.schedulers),
        list(target.dataloaders) if per_rank else [],
        target.scaler,
        **model_kwargs,
    )
    for obj, custom in zip(target.custom_objects, custom_states, strict=True):
        obj.load_state_dict(custom)
    if loaded.step is not None:
        target.step = loaded.step
    config = target.project_configuration
    match = _NUMBERED.match(os.path.basename(folder))
    if config.automatic_checkpoint_naming and match:
        config.iteration = int(match.group(1)) + 1
    _RESUME_POINTS[target.owner] = _resume_point(target, folder, loaded)
    logger.info("Loaded state from %s", folder)


def _resume_point(target: Any, folder: str, loaded: LoadedState) -> ResumePoint:
    positions = []
    for entry in loaded.dataloaders:
        state = entry[1] if entry is not None and isinstance(entry[1], dict) else {}
        positions.append((int(state.get("epoch", 0)), int(state.get("position", 0))))
    loaders = list(target.dataloaders)
    epoch, skip = positions[0] if positions else (0, 0)
    if loaders and getattr(loaders[0], "use_stateful_dataloader", False):
        skip = 0
    return ResumePoint(folder, int(target.step), epoch, skip, tuple(positions))


def resume_point(accelerator: Any) -> ResumePoint | None:
    """What the last ``load_state`` of ``accelerator`` restored, or None if it loaded nothing.

    Example:
        >>> if latest_checkpoint(project_dir):
        ...     accelerator.load_state()
        >>> point = resume_point(accelerator)
        >>> start_epoch, skip = (point.epoch, point.batches_to_skip) if point else (0, 0)
    """
    return _RESUME_POINTS.get(accelerator)
