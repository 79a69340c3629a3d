"""``Accelerator.load_state``: verify, read, agree, then apply; automatic resume with fallback.

Load verifies first (the manifest parsed and validated, the folder scanned without following links,
sizes always; checksums by default, every file's pieces hashed in parallel), reads with
``weights_only=True`` (full unpickling only on the caller's explicit opt-in), agrees across processes
that every rank succeeded, and only then applies it to the live objects.
Without an explicit folder the newest complete and intact checkpoint is used; damaged ones are skipped
with a warning.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, TypedDict

import accelerando.checkpointing.atomic as atomic
import accelerando.checkpointing.files as F
from accelerando.checkpointing.collective import gather
from accelerando.checkpointing.elastic import plan_resize, saved_accumulation
from accelerando.checkpointing.foreign import check_reference_files, is_reference_checkpoint
from accelerando.checkpointing.manifest import Manifest, inspect_checkpoint, require_listed, scan_folder
from accelerando.checkpointing.project import (
    NUMBERED,
    RESUME_POINT,
    ResumePoint,
    checkpoints_dir,
    owns_loading,
)
from accelerando.checkpointing.rng import derived_seed
from accelerando.checkpointing.sources import CheckedFiles, read_once, start_reading
from accelerando.checkpointing.state_io import (
    LoadedState,
    apply_state,
    check_load_kwargs,
    needed_files,
    read_state_files,
    torch_load_options,
)
from accelerando.checkpointing.target import CheckpointTarget
from accelerando.core.runtime import set_active_accelerator
from accelerando.data_loader.global_position import collected_notes, mark_saved_processes, warn_collected
from accelerando.scheduler import AcceleratedScheduler

if TYPE_CHECKING:
    import torch
    from torch.serialization import MAP_LOCATION

    from accelerando.state import AcceleratorState

    # What one process read from a candidate folder: (models, state, custom states, per-rank parts read).
    _Outcome = tuple[list[torch.nn.Module], LoadedState, list[object], bool]


class _Reading(TypedDict):
    """How each candidate folder is read (decided once per ``load_state``)."""

    map_location: MAP_LOCATION
    verify_checksums: bool
    allow_unverified: bool


__all__ = ["load_state", "restore_custom_objects"]

logger = logging.getLogger(__name__)


def _candidates(target: CheckpointTarget, input_dir: str | os.PathLike | None) -> tuple[list[str], bool]:
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
    root = checkpoints_dir(target)
    found = [path for _, path in reversed(atomic.list_checkpoints(root))]
    newest = int(os.path.basename(found[0]).split("_")[1]) if found else None
    foreign: list[tuple[int, str]] = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        match = NUMBERED.match(name)
        path = os.path.join(root, name)
        if not match or os.path.islink(path) or os.path.lexists(os.path.join(path, atomic.MANIFEST_NAME)):
            continue
        if os.path.isdir(path) and is_reference_checkpoint(os.listdir(path), path):
            foreign.append((int(match.group(1)), path))  # the reference library's: no manifest
        elif newest is None or int(match.group(1)) > newest:
            warnings.warn(f"Skipping incomplete checkpoint {path}: it has no manifest", stacklevel=3)
    if foreign:
        numbered = [(int(os.path.basename(p).split("_")[1]), p) for p in found] + foreign
        found = [path for _, path in sorted(numbered, reverse=True)]
    if not found:
        raise FileNotFoundError(
            f"No complete checkpoint under {root!r} to resume from; start fresh (see "
            "accelerando.checkpointing.latest_checkpoint to test for one first)."
        )
    return found, True


def _verify_folder(folder: str, allow_unverified: bool) -> tuple[Manifest | None, dict[str, int], bool]:
    """Parse the manifest and scan the folder (refusing links) before anything in it is read.

    A folder without a manifest laid out as the reference library's ``save_state`` writes it is
    loaded after a presence and header check, with one warning that it is unverified.

    Returns:
        The manifest (None for a folder without one), the folder's files, and whether the folder is
        the reference library's.
    """
    if not os.path.lexists(os.path.join(folder, atomic.MANIFEST_NAME)):
        present = scan_folder(folder, recursive=False)  # only its own entries are read
        if is_reference_checkpoint(present, folder):
            check_reference_files(folder, present)
            warnings.warn(
                f"{folder} has no {atomic.MANIFEST_NAME} and is laid out as the reference library's "
                "save_state writes it: its files' presence and headers were checked, but not their "
                "checksums, so it is loaded unverified.",
                stacklevel=4,
            )
            return None, present, True
        if allow_unverified:
            logger.warning("%s has no %s: loading it without verification", folder, atomic.MANIFEST_NAME)
            return None, present, False
    manifest, present = inspect_checkpoint(folder)  # parse, scan, sizes of every file
    return manifest, present, False


def _check_strategy_files(
    folder: str,
    manifest: Manifest,
    present: dict[str, int],
    names: list[str],
    checksums: bool,
    state: AcceleratorState,
) -> None:
    """Files a sharded strategy reads itself: every file must be listed; checksums split between ranks."""
    unlisted = sorted(set(present) - set(manifest.files) - {atomic.MANIFEST_NAME})
    require_listed(folder, manifest, unlisted[:1])
    if not checksums:
        return
    per_rank = (f"{F.RNG_STATE_NAME}_", f"{F.GRADIENTS_NAME}_")
    shared = sorted(n for n in set(manifest.files) - set(names) if not n.startswith(per_rank))
    atomic.verify_checksums(folder, manifest, shared[state.process_index :: max(1, state.num_processes)])


def _read_candidate(
    target: CheckpointTarget,
    folder: str,
    models: list[torch.nn.Module],
    map_location: MAP_LOCATION,
    verify_checksums: bool,
    allow_unverified: bool,
) -> tuple[LoadedState, list[object], bool]:
    """Read and verify one folder for this process. Returns (state, custom states, per-rank parts loaded)."""
    state = target.state
    manifest, present, foreign = _verify_folder(folder, allow_unverified)
    per_rank = manifest is None or manifest.world_size == state.num_processes
    rng_rank = None if manifest is None or per_rank else state.process_index % manifest.world_size
    if manifest is not None and not per_rank:
        warnings.warn(
            f"{folder} was saved by {manifest.world_size} processes and is loaded by {state.num_processes}: "
            "models, optimizers, schedulers, the scaler and custom objects are restored; random states "
            "follow the elastic rule (a process that existed gets its own back, a new one a state derived "
            "from them); prepared dataloaders continue the same global sample order; gradients of an "
            "unfinished accumulation cycle are per process and are not carried over. The batch per optimizer "
            "step follows the elastic_batch setting (docs: 'Changing the number of processes or the strategy').",
            stacklevel=3,
        )
    loaders = list(target.dataloaders)  # shared files: read on any number of processes (global position)
    layout = manifest.extra.get("layout") if manifest is not None else None
    saved_world = manifest.world_size if manifest is not None else state.num_processes
    target.strategy.plan_checkpoint_read(folder, layout if isinstance(layout, dict) else None, saved_world)
    owns = owns_loading(target, folder)  # then models and optimizers are read by the strategy (_apply)
    counts = (
        0 if owns else len(models),
        0 if owns else len(target.optimizers),
        len(target.schedulers),
        len(loaders),
        state.process_index,
        target.scaler is not None,
    )
    customs = [f"{F.CUSTOM_NAME}_{i}.pkl" for i in range(len(target.custom_objects))]
    names = needed_files(folder, *counts, per_rank=per_rank, rng_rank=rng_rank)
    names += [n for n in customs if n in present]
    reading: CheckedFiles | None = None
    sources: dict[str, memoryview] = {}
    if manifest is not None:
        require_listed(folder, manifest, names)  # the manifest is the complete list of what is read
        if owns:
            _check_strategy_files(folder, manifest, present, names, verify_checksums, state)
        # Each file is read once and checked (size now; checksum unless turned off) before anything in
        # it is applied or fully unpickled; the loaders below deserialize these same bytes.
        reading = start_reading(folder, manifest, names, verify_checksums)
        sources = reading.files if F.weights_only_default() else reading.verify()
    try:
        customs_read = {name: sources.pop(name) for name in customs if name in sources}
        try:
            # Weights-only deserializing runs no code and writes nothing, so it overlaps the hashing.
            loaded = read_state_files(
                folder,
                *counts,
                map_location=map_location,
                per_rank=per_rank,
                foreign=foreign,
                sources=sources,
                rng_rank=rng_rank,
            )
        except Exception:
            if reading is not None:
                reading.raise_damage()
            raise
        if reading is not None:
            reading.verify()
        if target.strategy.converts(folder):  # another strategy's layout: read and checked, not applied
            target.strategy.read_converted_checkpoint(models, list(target.optimizers))
        _note_saved_run(loaded, manifest, rng_rank, state.process_index)
        custom_states = [
            _load_custom(target, folder, i, name, present, customs_read.get(name))
            for i, name in enumerate(customs)
        ]
        if reading is not None:
            reading.guard.check()  # before the verdict: a file changed since its checksum is damage
            loaded.files = reading.guard  # checked again around the apply, then closed
    except BaseException:
        if reading is not None:
            reading.guard.close()
        raise
    finally:
        if reading is not None:
            reading.close()
    return loaded, custom_states, per_rank


def _note_saved_run(loaded: LoadedState, manifest: Manifest | None, rng_rank: int | None, rank: int) -> None:
    """Keep what the resize needs from the manifest; a process the saving run lacked gets its seed."""
    if manifest is not None:
        loaded.saved_world, loaded.saved_extra = manifest.world_size, dict(manifest.extra)
    if rng_rank is not None and rng_rank != rank and loaded.rng is not None:
        loaded.rng_seed = derived_seed(loaded.rng, rank)


def _load_custom(
    target: CheckpointTarget,
    folder: str,
    index: int,
    name: str,
    present: dict[str, int],
    data: memoryview | None = None,
) -> object:
    """Read the state of the ``index``-th registered object (weights-only unless the caller opted in);
    from ``data`` when the file was already read (and verified) by ``read_once``.
    """
    if name not in present:
        raise FileNotFoundError(
            f"Checkpoint {folder!r} has no {name!r}: fewer objects were registered with "
            "register_for_checkpointing when it was saved; register the same objects in the same order."
        )
    path = os.path.join(folder, name)
    try:
        return F.torch_load(path, data=data)
    except F.UnsafeCheckpointError as err:
        kind = type(target.custom_objects[index]).__name__
        hint = (
            f" It is the state of registered object {index} (a {kind}); a state_dict() of tensors and plain "
            "Python data (numbers, strings, lists, dicts) loads without the opt-in."
        )
        raise F.UnsafeCheckpointError(path, err.refused, hint) from None


def restore_custom_objects(target: CheckpointTarget, folder: str | os.PathLike, start: int) -> None:
    """Restore the registered objects from index ``start`` on from ``folder``'s custom-state files.

    For objects registered after ``folder`` was loaded (``auto_resume`` loads in the first ``prepare()``,
    scripts often call ``register_for_checkpointing`` after it): the ``i``-th registered object reads
    ``custom_checkpoint_<i>.pkl``, the same index rule ``save_state`` writes by. The files are checked as
    ``load_state`` checks them (listed in the manifest, checksums per the ``verify_checksums`` setting,
    links refused) and read with ``weights_only=True``.

    Raises:
        FileNotFoundError: If ``folder`` has no file for one of the objects (it was saved with fewer
            registered objects); the message says how to order the calls.
        CheckpointError: If a file is damaged or not listed by the manifest.
        UnsafeCheckpointError: If a file needs full unpickling (no opt-in on this path).
    """
    folder = os.path.abspath(os.fspath(folder))
    objects = list(target.custom_objects)
    customs = [f"{F.CUSTOM_NAME}_{i}.pkl" for i in range(start, len(objects))]
    if not customs:
        return
    if os.path.lexists(os.path.join(folder, atomic.MANIFEST_NAME)):
        manifest, present = inspect_checkpoint(folder)
    else:
        manifest, present = None, scan_folder(folder, recursive=False)  # links refused
    missing = [name for name in customs if name not in present]
    if missing:
        raise FileNotFoundError(
            f"auto_resume resumed from {folder!r}, which has no {missing[0]!r}: the object registered now "
            f"(register_for_checkpointing index {start + customs.index(missing[0])}) was not saved in it. "
            "Register the same objects in the same order as the run that saved it, or call "
            "accelerator.load_state() yourself after registering."
        )
    sources: dict[str, memoryview] = {}
    guard = None
    if manifest is not None:
        sources, guard = read_once(folder, manifest, customs, _default_verification(target))  # checked
    try:
        states = [
            _load_custom(target, folder, start + k, name, present, sources.get(name))
            for k, name in enumerate(customs)
        ]
        if guard is not None:
            guard.check()  # the states were copied out of the bytes: nothing maps the files any more
    finally:
        if guard is not None:
            guard.close()
    for obj, custom in zip(objects[start:], states, strict=True):
        obj.load_state_dict(custom)
    logger.info("Restored %d late-registered object(s) from %s", len(states), folder)


def _attempt(
    target: CheckpointTarget, folder: str, kwargs: _Reading
) -> tuple[_Outcome | None, BaseException | None, list[tuple[int, str, bool]]]:
    """Try one folder on every process; returns the read state or the local error, plus everyone's verdict."""
    models = list(target.models)
    for hook in target.load_hooks:
        hook(models, folder)
    outcome: _Outcome | None
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
    verdict: tuple[int, tuple[str, bool] | None] = (target.state.process_index, report)
    verdicts = gather(verdict, target.state.num_processes)
    return outcome, error, [(rank, *rep) for rank, rep in verdicts if rep is not None]


def _is_damage(error: BaseException) -> bool:
    """Whether a load error means a damaged file (fall back) rather than a bug or a mismatch (raise).

    A refused unsafe file is not damage: it is raised, with the opt-in, instead of silently skipped.
    """
    import pickle

    if isinstance(error, F.UnsafeCheckpointError):
        return False

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
    target: CheckpointTarget,
    input_dir: str | os.PathLike | None = None,
    # Any: the reference's mix of reading options and load_state_dict keywords, told apart below.
    **load_model_func_kwargs: Any,
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
            are always checked), ``allow_unverified`` (default False: an explicit folder without a manifest,
            e.g. written by another library, is loaded with a warning instead of refused) and
            ``load_kwargs`` (the reference's ``torch.load`` options for every file read: ``mmap``,
            ``map_location`` (when not given itself), ``encoding``...; ``{"weights_only": False}`` is the
            explicit opt-in to fully unpickling files that need it, which runs any code they hold;
            without it such files are refused).

    Every ``.bin`` / ``.pkl`` / ``.pt`` file is read with ``torch.load(weights_only=True)``. With a
    manifest, it is the complete list of what may be read: a needed file it does not list, an entry
    that is not a plain name inside the folder, an unknown checksum algorithm, a symbolic link in the
    folder or a manifest that does not parse is damage.

    Raises:
        FileNotFoundError: If the folder does not exist, or no checkpoint exists to resume from.
        ValueError: If no folder is given and automatic naming is off.
        TypeError: If ``load_kwargs`` is not a dict or its ``weights_only`` not a bool.
        CheckpointError: If the checkpoint is damaged (explicit folder) or every candidate is.
        UnsafeCheckpointError: (a ``CheckpointError``) If a file holds objects that only full
            unpickling rebuilds and the caller did not opt in; never skipped in automatic mode.
    """
    set_active_accelerator(target.owner)
    load_kwargs = load_model_func_kwargs.pop("load_kwargs", None)
    weights_only = check_load_kwargs(load_kwargs)
    map_location, load_options = torch_load_options(
        load_kwargs, load_model_func_kwargs.pop("map_location", None)
    )
    candidates, may_fall_back = _candidates(target, input_dir)
    kwargs: _Reading = {
        "map_location": map_location,
        "verify_checksums": bool(
            load_model_func_kwargs.pop("verify_checksums", _default_verification(target))
        ),
        "allow_unverified": bool(load_model_func_kwargs.pop("allow_unverified", False)) and not may_fall_back,
    }
    for folder in candidates:
        with F.unpickling(weights_only, load_options):  # the strategy's own loaders in _apply follow it too
            outcome, error, failed = _attempt(target, folder, kwargs)
            if not failed:
                assert outcome is not None  # this process read it (else it would have failed)
                _apply(target, folder, outcome, load_model_func_kwargs)
                return
        if not may_fall_back or not all(is_damage for _, _, is_damage in failed):
            if error is not None:
                raise error
            raise atomic.CheckpointError(
                f"Checkpoint not loaded: process {failed[0][0]} could not load {folder!r}: {failed[0][1]}"
            )
        logger.warning("Skipping checkpoint %s: %s", folder, failed[0][1])
        warnings.warn(f"Skipping damaged checkpoint {folder}: {failed[0][1]}", stacklevel=2)
    raise atomic.CheckpointError(
        f"Every checkpoint under {os.path.dirname(candidates[0])!r} is damaged; nothing was loaded. "
        "Start fresh or repair one (the warnings above name the damaged files)."
    )


def _default_verification(target: CheckpointTarget) -> bool:
    """The ``verify_checksums`` setting (code > launcher > ACCELERANDO_VERIFY_CHECKSUMS > config > True)."""
    return bool(target.settings.verify_checksums)


def _apply(target: CheckpointTarget, folder: str, outcome: _Outcome, model_kwargs: dict[str, bool]) -> None:
    models, loaded, custom_states, per_rank = outcome
    optimizers: list[torch.optim.Optimizer] = list(target.optimizers)
    strategy = target.strategy
    if strategy.converts(folder):
        strategy.apply_converted_checkpoint(models, optimizers)
        models, optimizers = [], []
    elif owns_loading(target):
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
    loaders = list(target.dataloaders)
    if not per_rank and loaded.saved_world is not None:
        mark_saved_processes(loaded.dataloaders, loaded.saved_world)
    with collected_notes() as notes:  # loaders that cannot continue exactly: one line each, by index
        apply_state(
            loaded, models, optimizers, list(target.schedulers), loaders, target.scaler, **model_kwargs
        )
    warn_collected(notes, loaders, folder)
    for obj, custom in zip(target.custom_objects, custom_states, strict=True):
        obj.load_state_dict(custom)
    if loaded.step is not None:
        target.step = loaded.step
    _resize(target, folder, loaded, per_rank)
    config = target.project_configuration
    match = NUMBERED.match(os.path.basename(folder))
    if config.automatic_checkpoint_naming and match:
        config.iteration = int(match.group(1)) + 1
    target.memory.put(RESUME_POINT, _resume_point(target, folder, loaded))
    logger.info("Loaded state from %s", folder)


def _resize(target: CheckpointTarget, folder: str, loaded: LoadedState, per_rank: bool) -> None:
    """Apply the ``elastic_batch`` setting: accumulation steps, step counter and schedule pace."""
    saved_world = loaded.saved_world
    if saved_world is None:
        return  # no record of how the saved run stepped (the reference's folders)
    plan = plan_resize(
        loaded.saved_extra,
        saved_world,
        target.state.num_processes,
        target.gradient_accumulation_steps,
        int(target.step),
        target.split_batches,
        target.settings.elastic_batch,
    )
    target.gradient_accumulation_steps = plan.gradient_accumulation_steps
    target.step = plan.step
    if plan.scheduler_repeats is not None:
        for scheduler, repeats in zip(target.schedulers, plan.scheduler_repeats, strict=False):
            if isinstance(scheduler, AcceleratedScheduler):
                scheduler.steps_per_optimizer_step = repeats
    saved_cycle = saved_accumulation(loaded.saved_extra, plan.gradient_accumulation_steps)
    if not per_rank and loaded.step and loaded.step % saved_cycle:
        logger.warning(
            "%s was saved in the middle of an accumulation cycle on %d processes: the gradients "
            "accumulated so far are per process and are not carried to %d; the optimizer step in "
            "progress misses them (save at an optimizer step to resume exactly)",
            folder,
            saved_world,
            target.state.num_processes,
        )
    if plan.message and target.state.is_main_process:
        logger.warning(plan.message)


def _resume_point(target: CheckpointTarget, folder: str, loaded: LoadedState) -> ResumePoint:
    positions = []
    loaders = list(target.dataloaders)
    for i, entry in enumerate(loaded.dataloaders):
        state = entry[1] if entry is not None and isinstance(entry[1], dict) else {}
        position = (int(state.get("epoch", 0)), int(state.get("position", 0)))
        # A state from another layout: the position in this loader's batches (global_position).
        translated = getattr(loaders[i], "resume_position", None) if i < len(loaders) else None
        positions.append((translated() if callable(translated) else None) or position)
    epoch, skip = positions[0] if positions else (0, 0)
    if loaders and getattr(loaders[0], "use_stateful_dataloader", False):
        skip = 0
    return ResumePoint(folder, int(target.step), epoch, skip, tuple(positions))
