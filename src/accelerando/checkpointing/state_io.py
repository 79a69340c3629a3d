"""Write and read the state files of one checkpoint folder (no commit logic here).

Reading is split from applying: everything is read (and verified) first, and only then put into the
live objects, so a damaged checkpoint never leaves a model half-loaded.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypeVar

import torch

import accelerando.checkpointing.files as F
from accelerando.checkpointing.foreign import read_reference_rng, reference_rng_payload
from accelerando.checkpointing.rng import capture_rng_states, restore_rng_states
from accelerando.checkpointing.sources import FileGuard
from accelerando.checkpointing.target import Stateful
from accelerando.checkpointing.workers import threads_for_copies
from accelerando.common.random import set_seed
from accelerando.common.serialization import _should_write
from accelerando.common.unwrap import unwrap_model

if TYPE_CHECKING:
    from torch.serialization import MAP_LOCATION

__all__ = [
    "LoadedState",
    "StateSource",
    "apply_state",
    "capture_gradients",
    "check_load_kwargs",
    "load_optimizer_state",
    "needed_files",
    "read_state_files",
    "torch_load_options",
    "unwrap",
    "write_state_files",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class StateSource(Protocol):
    """An object whose ``state_dict()`` a checkpoint writes (optimizers, schedulers, the scaler)."""

    def state_dict(self) -> object:
        """The state to write."""
        ...


class _Put(Protocol):
    """Writes ``obj`` with ``writer`` as the file ``name`` of the folder, and records it."""

    def __call__(self, name: str, writer: Callable[[_T, str], None], obj: _T, /) -> None: ...


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside every wrapper (DDP, FSDP, DeepSpeed, ``torch.compile``).

    The one unwrapping every strategy uses (:func:`accelerando.common.unwrap.unwrap_model`), with
    compilation removed too: checkpoints hold the plain module's parameter names.
    """
    return unwrap_model(model, keep_torch_compile=False)


def _dataloader_state(loader: object) -> tuple[str, object] | None:
    """``(file stem, state)`` of a dataloader: its own state dict, else its sampler's, else None."""
    own = getattr(loader, "state_dict", None)
    if callable(own):
        return F.DATALOADER_STATE_NAME, own()
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not callable(getattr(sampler, "state_dict", None)):
        batch_sampler = getattr(loader, "batch_sampler", None)
        sampler = getattr(batch_sampler, "sampler", None)
    of_sampler = getattr(sampler, "state_dict", None) if sampler is not None else None
    if callable(of_sampler):
        return F.SAMPLER_NAME, of_sampler()
    return None


def capture_gradients(models: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Accumulated ``.grad`` tensors of the models' parameters, keyed ``<model index>.<name>``."""
    grads: dict[str, torch.Tensor] = {}
    for i, model in enumerate(models):
        for name, param in unwrap(model).named_parameters():
            if param.grad is not None:
                grads[f"{i}.{name}"] = param.grad.detach()
    return grads


def write_state_files(
    output_dir: str,
    model_states: Sequence[dict[str, torch.Tensor] | None],
    optimizers: Sequence[StateSource | None],
    schedulers: Sequence[StateSource],
    dataloaders: Sequence[object],
    process_index: int,
    step: int,
    scaler: StateSource | None = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
    gradients: dict[str, torch.Tensor] | None = None,
    on_written: Callable[[str], None] | None = None,
) -> list[str]:
    """Write this process's share of the state files into ``output_dir``.

    The main process (each node's local main with ``save_on_each_node``) writes the shared files
    (weights, optimizer, scheduler, dataloader, scaler); every process writes its random states and,
    when given, its accumulated gradients.

    Args:
        on_written: Called with each file's name as soon as it is complete (e.g. to start flushing it).

    Returns:
        The names (relative to ``output_dir``) of the files this process wrote.
    """
    written: list[str] = []

    def put(name: str, writer: Callable[[_T, str], None], obj: _T) -> None:
        writer(obj, os.path.join(output_dir, name))
        written.append(name)
        if on_written is not None:
            on_written(name)

    if _should_write(save_on_each_node):
        _write_shared_files(
            put, model_states, optimizers, schedulers, dataloaders, scaler, safe_serialization
        )
    payload = {"step": int(step), "rng": capture_rng_states()}
    put(f"{F.RNG_STATE_NAME}_{process_index}.pkl", F.torch_save, payload)
    if gradients:
        put(
            f"{F.GRADIENTS_NAME}_{process_index}.safetensors",
            lambda o, p: F.save_model_weights(o, p, True),
            gradients,
        )
    return written


def _write_shared_files(
    put: _Put,
    model_states: Sequence[dict[str, torch.Tensor] | None],
    optimizers: Sequence[StateSource | None],
    schedulers: Sequence[StateSource],
    dataloaders: Sequence[object],
    scaler: StateSource | None,
    safe_serialization: bool,
) -> None:
    """The files one process writes for all: weights, optimizer, scheduler, dataloader and scaler states.

    A model state or optimizer that is None was written by the strategy itself and is skipped.
    """
    for i, state in enumerate(model_states):
        if state is None:  # written by the strategy itself
            continue
        name = F.model_file(i, safe_serialization)
        put(name, lambda o, p: F.save_model_weights(o, p, safe_serialization), state)
    for i, optimizer in enumerate(optimizers):
        if optimizer is None:  # written by the strategy itself
            continue
        put(F.indexed(F.OPTIMIZER_NAME, i, ".bin"), F.torch_save, optimizer.state_dict())
    for i, scheduler in enumerate(schedulers):
        put(F.indexed(F.SCHEDULER_NAME, i, ".bin"), F.torch_save, scheduler.state_dict())
    for i, loader in enumerate(dataloaders):
        found = _dataloader_state(loader)
        if found is not None:
            put(F.indexed(found[0], i, ".bin"), F.torch_save, found[1])
    if scaler is not None:
        put(F.SCALER_NAME, F.torch_save, scaler.state_dict())


@dataclass
class LoadedState:
    """Everything read from a checkpoint folder, not yet applied."""

    models: list[dict[str, torch.Tensor]] = field(default_factory=list)
    optimizers: list[dict[str, object]] = field(default_factory=list)
    schedulers: list[object] = field(default_factory=list)
    dataloaders: list[tuple[str, object] | None] = field(default_factory=list)
    scaler: dict[str, object] | None = None
    rng: dict[str, object] | None = None
    # A process the saving run did not have: seed every generator with this after restoring ``rng``.
    rng_seed: int | None = None
    step: int | None = None
    gradients: dict[str, torch.Tensor] | None = None
    # The saving run's number of processes and its manifest's ``extra`` (None without a manifest).
    saved_world: int | None = None
    saved_extra: dict[str, object] = field(default_factory=dict)
    # The mapped files the tensors above are views of (checked around the apply, then closed).
    files: FileGuard | None = None


def _dataloader_file(folder: str, index: int) -> tuple[str, str] | None:
    for stem in (F.DATALOADER_STATE_NAME, F.SAMPLER_NAME):
        name = F.indexed(stem, index, ".bin")
        if os.path.exists(os.path.join(folder, name)):
            return stem, name
    return None


def needed_files(
    folder: str,
    num_models: int,
    num_optimizers: int,
    num_schedulers: int,
    num_dataloaders: int,
    process_index: int,
    with_scaler: bool,
    per_rank: bool = True,
    rng_rank: int | None = None,
) -> list[str]:
    """Names of the files this process reads for the given objects (only those that exist).

    ``rng_rank``: on another number of processes (``per_rank`` False), the saved process whose random
    states (and step) this process reads; None reads none.
    """
    names = [os.path.basename(F.find_model_file(folder, i)) for i in range(num_models)]
    names += [F.indexed(F.OPTIMIZER_NAME, i, ".bin") for i in range(num_optimizers)]
    names += [F.indexed(F.SCHEDULER_NAME, i, ".bin") for i in range(num_schedulers)]
    names += [found[1] for i in range(num_dataloaders) if (found := _dataloader_file(folder, i))]
    if with_scaler:
        names.append(F.SCALER_NAME)
    if per_rank:
        names.append(f"{F.RNG_STATE_NAME}_{process_index}.pkl")
        grads = f"{F.GRADIENTS_NAME}_{process_index}.safetensors"
        if os.path.exists(os.path.join(folder, grads)):
            names.append(grads)
    elif rng_rank is not None:
        names.append(f"{F.RNG_STATE_NAME}_{rng_rank}.pkl")
    return [n for n in names if os.path.exists(os.path.join(folder, n))]


def _require(folder: str, name: str, what: str) -> str:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"Checkpoint {folder!r} has no {name!r} ({what}); it was saved with fewer objects or "
            "processes. Prepare the same objects as when saving, or pass another checkpoint."
        )
    return path


def read_state_files(
    folder: str,
    num_models: int,
    num_optimizers: int,
    num_schedulers: int,
    num_dataloaders: int,
    process_index: int,
    with_scaler: bool,
    map_location: MAP_LOCATION = None,
    per_rank: bool = True,
    foreign: bool = False,
    sources: Mapping[str, memoryview] | None = None,
    rng_rank: int | None = None,
) -> LoadedState:
    """Read (without applying) the state files for the given numbers of objects.

    Args:
        per_rank: Also read this process's random states and accumulated gradients.
        rng_rank: With ``per_rank`` False (another number of processes), read the random states and
            step of this saved process instead (None: none).
        foreign: The folder was written by the reference library (its random-state format; its
            pickled ``sampler.bin`` objects are skipped with a warning).
        sources: Files already read (and verified) by name
            (:func:`accelerando.checkpointing.sources.read_once`): their bytes are deserialized
            instead of the files being read again.

    Raises:
        FileNotFoundError: Naming a file the objects need that the folder lacks.
    """
    read = dict(sources or {})

    def data(path: str) -> memoryview | None:
        return read.pop(os.path.basename(path), None)  # dropped here: the caller's tensors keep it

    out = LoadedState()
    for i in range(num_models):
        path = F.find_model_file(folder, i)
        out.models.append(F.load_model_weights(path, map_location, data=data(path)))
    for i in range(num_optimizers):
        path = _require(folder, F.indexed(F.OPTIMIZER_NAME, i, ".bin"), f"optimizer {i}")
        out.optimizers.append(F.torch_load(path, "cpu", mapped=True, data=data(path)))
    for i in range(num_schedulers):
        path = _require(folder, F.indexed(F.SCHEDULER_NAME, i, ".bin"), f"scheduler {i}")
        out.schedulers.append(F.torch_load(path, data=data(path)))
    for i in range(num_dataloaders):
        found = _dataloader_file(folder, i)
        if found is not None and foreign and found[0] == F.SAMPLER_NAME:
            warnings.warn(
                f"{os.path.join(folder, found[1])} holds a pickled sampler object, which cannot be read "
                "weights-only; it is skipped (a seeded sampler's order follows data_seed and set_epoch).",
                stacklevel=2,
            )
            found = None
        if found is None:
            out.dataloaders.append(None)
            continue
        path = os.path.join(folder, found[1])
        out.dataloaders.append((found[0], F.torch_load(path, data=data(path))))
    if with_scaler:
        path = _require(folder, F.SCALER_NAME, "the GradScaler")
        out.scaler = F.torch_load(path, data=data(path))
    source = process_index if per_rank else rng_rank
    if source is not None:
        name = f"{F.RNG_STATE_NAME}_{source}.pkl"
        path = _require(folder, name, f"random states of process {source}")
        if foreign:
            payload = read_reference_rng(path)
            out.step = int(payload.get("step", 0))
            out.rng = payload["rng"] if "rng" in payload else reference_rng_payload(payload)
        else:
            payload = F.torch_load(path, data=data(path))
            out.step = int(payload.get("step", 0))
            out.rng = payload.get("rng")
        grads = os.path.join(folder, f"{F.GRADIENTS_NAME}_{process_index}.safetensors")
        if per_rank and os.path.exists(grads):
            out.gradients = F.load_model_weights(grads, data=data(grads))
    return out


def _apply_dataloader(loader: object, entry: tuple[str, object]) -> None:
    stem, state = entry
    own = getattr(loader, "load_state_dict", None)
    if stem == F.DATALOADER_STATE_NAME and callable(own):
        own(state)
        return
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not callable(getattr(sampler, "load_state_dict", None)):
        sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    of_sampler = getattr(sampler, "load_state_dict", None) if sampler is not None else None
    if callable(of_sampler):
        of_sampler(state)
    else:
        logger.warning(
            "Dataloader %s has no load_state_dict: its saved %s state was not restored", loader, stem
        )


def _apply_gradients(models: Sequence[torch.nn.Module], grads: dict[str, torch.Tensor]) -> None:
    for i, model in enumerate(models):
        for name, param in unwrap(model).named_parameters():
            saved = grads.get(f"{i}.{name}")
            if saved is not None:
                # copy=True: safetensors returns tensors backed by the file's memory map
                param.grad = saved.to(device=param.device, dtype=param.dtype, copy=True)


def _tensors(tree: object) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for value in tree.values() for t in _tensors(value)]
    if isinstance(tree, list | tuple):
        return [t for value in tree for t in _tensors(value)]
    return []


def load_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: dict[str, object]) -> None:
    """``optimizer.load_state_dict(state_dict)`` that reuses the optimizer's current state memory.

    ``state_dict`` may hold tensors backed by a memory map of the checkpoint file (see
    ``files.torch_load(mapped=True)``). After the optimizer's own ``load_state_dict`` has mapped and cast
    every value, each one still backed by the file is copied into the tensor the optimizer held
    for the same parameter and key when their shape, dtype and device agree (no new allocation, and
    the old and new state never coexist), and cloned into fresh memory otherwise. The result is the
    same as a plain ``load_state_dict`` bit for bit, and no tensor keeps the file open.
    """
    state = _inner_state(optimizer)
    previous = {id(param): dict(values) for param, values in state.items() if isinstance(values, dict)}
    mapped = {t.untyped_storage().data_ptr() for t in _tensors(state_dict) if t.numel()}
    optimizer.load_state_dict(state_dict)
    if not mapped:
        return

    def is_mapped(value: object) -> TypeGuard[torch.Tensor]:
        return (
            isinstance(value, torch.Tensor)
            and bool(value.numel())
            and value.untyped_storage().data_ptr() in mapped
        )

    for group in getattr(optimizer, "param_groups", []):
        for key, value in group.items():
            group[key] = _unmapped(value, is_mapped)  # e.g. a tensor learning rate
    state = _inner_state(optimizer)  # load_state_dict put a new state object in place
    for param, values in list(state.items()):
        if not isinstance(values, dict):  # an optimizer of its own kind: clone whatever is mapped
            state[param] = _unmapped(values, is_mapped)
            continue
        old = previous.get(id(param), {})
        for key, value in list(values.items()):
            if not is_mapped(value):
                values[key] = _unmapped(value, is_mapped)  # converted already, or nested deeper
                continue
            target = old.get(key)
            if (
                isinstance(target, torch.Tensor)
                and target is not value
                and (target.shape, target.dtype, target.device) == (value.shape, value.dtype, value.device)
            ):
                values[key] = target.copy_(value)
            else:
                values[key] = value.clone()


def _unmapped(tree: object, is_mapped: Callable[[object], bool]) -> object:
    """``tree`` with every tensor for which ``is_mapped`` holds replaced by a clone.

    Dicts and lists are updated in place (and returned); tuples are rebuilt.
    """
    if isinstance(tree, torch.Tensor):
        return tree.clone() if is_mapped(tree) else tree
    if isinstance(tree, dict):
        for key, value in tree.items():
            tree[key] = _unmapped(value, is_mapped)
        return tree
    if isinstance(tree, list):
        tree[:] = [_unmapped(value, is_mapped) for value in tree]
        return tree
    if isinstance(tree, tuple):
        items = [_unmapped(value, is_mapped) for value in tree]
        return _rebuilt(type(tree), items, named=hasattr(tree, "_fields"))
    return tree


def _rebuilt(kind: Callable[..., object], items: list[object], named: bool) -> object:
    """A tuple of class ``kind`` holding ``items`` (a named tuple takes its fields one by one)."""
    return kind(*items) if named else kind(items)


def _inner_state(optimizer: object) -> dict[object, object]:
    return getattr(optimizer, "state", {})


def _with_tied_aliases(
    module: torch.nn.Module, state: Mapping[str, torch.Tensor]
) -> Mapping[str, torch.Tensor]:
    """``state`` with the keys of tied weights that safetensors saved once filled in from their twin.

    safetensors cannot store two names for one memory, so a model whose ``linear2.weight`` *is*
    ``linear1.weight`` is saved with one of the names only. Each name the live ``module`` has and
    ``state`` lacks takes the value saved under a name sharing its memory in ``module``; any other
    missing key stays missing, so ``load_state_dict``'s strict check still reports it.
    """
    if not isinstance(state, dict) or not hasattr(module, "state_dict"):
        return state
    live = module.state_dict(keep_vars=True)
    missing = [name for name in live if name not in state]
    if not missing:
        return state
    groups: dict[tuple[object, ...], list[str]] = {}
    for name, tensor in live.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" and tensor.numel():
            where = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            groups.setdefault((*where, tuple(tensor.shape), tensor.stride()), []).append(name)
    twins = {name: names for names in groups.values() if len(names) > 1 for name in names}
    filled = dict(state)
    for name in missing:
        saved = next((twin for twin in twins.get(name, ()) if twin in state), None)
        if saved is not None:
            filled[name] = state[saved]
    return filled


def apply_state(
    loaded: LoadedState,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    schedulers: Sequence[Stateful],
    dataloaders: Sequence[object],
    scaler: Stateful | None = None,
    **load_model_func_kwargs: bool,
) -> None:
    """Put a :class:`LoadedState` into live objects (models get ``load_model_func_kwargs``).

    When ``loaded.files`` holds the mapped files its tensors are views of, each is checked unchanged
    on disk before anything is applied and again after (then closed).

    Raises:
        CheckpointError: If a mapped file changed on disk since it was opened: before the apply,
            nothing is applied; after it, the message says the objects may hold unverified bytes.
    """
    files = loaded.files
    try:
        if files is not None:
            files.check()  # a truncated file is refused here, before a page past its end is touched
        _apply_read_state(
            loaded, models, optimizers, schedulers, dataloaders, scaler, **load_model_func_kwargs
        )
        if files is not None:
            files.check(applied=True)
    finally:
        if files is not None:
            files.close()


def _apply_read_state(
    loaded: LoadedState,
    models: Sequence[torch.nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    schedulers: Sequence[Stateful],
    dataloaders: Sequence[object],
    scaler: Stateful | None = None,
    **load_model_func_kwargs: bool,
) -> None:
    with threads_for_copies():  # one-time copies of every weight and optimizer state
        for model, state in zip(models, loaded.models, strict=True):
            module = unwrap(model)
            module.load_state_dict(_with_tied_aliases(module, state), **load_model_func_kwargs)
        for optimizer, state in zip(optimizers, loaded.optimizers, strict=True):
            load_optimizer_state(optimizer, state)
    for scheduler, state in zip(schedulers, loaded.schedulers, strict=True):
        scheduler.load_state_dict(state)
    for loader, entry in zip(dataloaders, loaded.dataloaders, strict=True):
        if entry is not None:
            _apply_dataloader(loader, entry)
    if scaler is not None and loaded.scaler is not None:
        scaler.load_state_dict(loaded.scaler)
    if loaded.gradients:
        _apply_gradients(models, loaded.gradients)
    if loaded.rng is not None:
        restore_rng_states(loaded.rng)
        if loaded.rng_seed is not None:
            set_seed(loaded.rng_seed)


# torch.load's keyword arguments (its **pickle_load_args reach the unpickler: encoding, errors...).
_TORCH_LOAD_KEYS = frozenset({"weights_only", "map_location", "mmap", "pickle_module", "encoding", "errors"})


def check_load_kwargs(load_kwargs: dict[str, object] | None) -> bool:
    """Check the reference's ``load_kwargs`` (options for ``torch.load``); return ``weights_only``.

    ``weights_only`` is honoured: False is the caller's explicit opt-in to full unpickling, which runs
    whatever code the checkpoint files hold. The other keys are ``torch.load``'s and reach it through
    :func:`torch_load_options`.

    Returns:
        The ``weights_only`` to read checkpoint files with (True unless the caller passed False).

    Raises:
        TypeError: If ``load_kwargs`` is not a dict, its ``weights_only`` is not a bool, or a key is
            not a ``torch.load`` option (the message lists them).
    """
    if load_kwargs is None:
        return True
    if not isinstance(load_kwargs, dict):
        raise TypeError(
            f"load_kwargs must be a dict such as {{'weights_only': False}}, got {type(load_kwargs).__name__}."
        )
    weights_only = load_kwargs.get("weights_only", True)
    if not isinstance(weights_only, bool):
        raise TypeError(f"load_kwargs['weights_only'] must be True or False, got {repr(weights_only)[:40]}.")
    unknown = sorted(str(key) for key in load_kwargs if key not in _TORCH_LOAD_KEYS)
    if unknown:
        raise TypeError(
            f"load_kwargs keys {unknown} are not torch.load options; use some of {sorted(_TORCH_LOAD_KEYS)}."
        )
    if not weights_only:
        logger.warning(
            "load_kwargs={'weights_only': False}: checkpoint files that need it are fully unpickled, which "
            "runs any code they hold; do this only for checkpoints you trust."
        )
    return weights_only


# Any: the caller's torch.load options; map_location among them is taken as torch.load takes it.
def torch_load_options(
    load_kwargs: Mapping[str, Any] | None, map_location: MAP_LOCATION = None
) -> tuple[MAP_LOCATION, dict[str, object]]:
    """Split checked ``load_kwargs`` into the load's ``map_location`` and the other ``torch.load`` options.

    ``load_kwargs["map_location"]`` is the map location when the call gave none of its own; the
    remaining keys (``mmap``, ``pickle_module``, ``encoding``...) go to every ``torch.load`` of the load
    (through :func:`accelerando.checkpointing.files.unpickling`).

    Returns:
        ``(map_location, options)``.

    Raises:
        ValueError: ``map_location`` was given both as an argument and in ``load_kwargs``, differently.
    """
    options = {k: v for k, v in (load_kwargs or {}).items() if k != "weights_only"}
    if "map_location" in options:
        from_kwargs = options.pop("map_location")
        if map_location is not None and map_location != from_kwargs:
            raise ValueError(
                f"map_location={map_location!r} and load_kwargs['map_location']={from_kwargs!r} differ; "
                "give it once"
            )
        map_location = from_kwargs
    return map_location, options
