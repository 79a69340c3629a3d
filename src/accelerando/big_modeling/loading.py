"""Load checkpoints into (possibly empty) models, one tensor at a time, straight to their device.

Peak memory while loading is the model's own placed weights plus one tensor: tensors are read from
the file directly into the memory that becomes the parameter (no whole-state-dict copy), and
tensors mapped to ``"disk"`` that already sit in a safetensors file are indexed in place instead of
being rewritten. :func:`load_checkpoint_and_dispatch` adds the usual next steps: plan a device map,
load, then dispatch the model over it with hooks.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from accelerando.big_modeling.budgets import check_device_visible, get_balanced_memory
from accelerando.big_modeling.device_map import infer_auto_device_map
from accelerando.big_modeling.dispatch import dispatch_model
from accelerando.big_modeling.offload import (
    SAFETENSORS_DTYPES,
    offload_weight,
    read_safetensors_header,
    safetensors_view,
    save_offload_index,
)
from accelerando.big_modeling.sizes import parse_dtype
from accelerando.big_modeling.tensors import (
    find_tied_parameters,
    retie_parameters,
    set_module_tensor_to_device,
    summarize_names,
    tensors_on_meta,
    to_torch_device,
)
from accelerando.settings.fields import quote_value

__all__ = ["checkpoint_files", "load_checkpoint_and_dispatch", "load_checkpoint_in_model", "load_state_dict"]

logger = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_DEFAULT_INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_DEFAULT_SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin")


def checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """Resolve a checkpoint given as a file, a ``*.index.json`` or a folder to its weight files.

    Args:
        checkpoint: a ``.safetensors``/``.bin`` file, a sharded checkpoint's index, or a folder holding
            either (an index is preferred, then ``model.safetensors``, then a single weights file).

    Returns:
        The weight files to read, in shard order.

    Raises:
        ValueError: if nothing loadable is found (the message lists what the folder holds), or an
            index is unreadable or names a shard outside its own folder (nothing outside is touched).
    """
    path = Path(checkpoint)
    if path.is_file() and path.name.endswith(".json"):
        return _index_shards(path)
    if path.is_file():
        return [str(path)]
    if not path.is_dir():
        raise ValueError(
            f"Checkpoint {str(checkpoint)!r} does not exist; pass a weights file, an index or a folder."
        )
    for name in (*_DEFAULT_INDEX_NAMES, *_DEFAULT_SINGLE_NAMES):
        if (path / name).is_file():
            return checkpoint_files(path / name)
    indexes = sorted(p for p in path.iterdir() if p.name.endswith(".index.json"))
    if len(indexes) == 1:
        return checkpoint_files(indexes[0])
    weights = sorted(p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    if len(weights) == 1:
        return [str(weights[0])]
    raise ValueError(
        f"{path} holds no single checkpoint (found {sorted(p.name for p in path.iterdir())}); pass the weights "
        "file or the *.index.json of a sharded checkpoint."
    )


def _index_shards(index: Path) -> list[str]:
    """The shard files an ``*.index.json`` lists, each checked to lie inside the index's folder.

    Every entry is checked by its text before any file is opened: a shard index comes with the
    checkpoint, and an entry such as ``../../x`` or ``/etc/x`` must not make us read elsewhere.
    """
    fix = "Fix: re-save the checkpoint, or pass a sharded checkpoint's *.index.json file."
    try:
        with open(index, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(
            f"{index} is not a readable checkpoint index ({type(err).__name__}). {fix}"
        ) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index} has no 'weight_map' mapping. {fix}")
    for key, entry in weight_map.items():
        if not isinstance(entry, str) or not entry or "\x00" in entry:
            raise ValueError(
                f"{index}: weight_map[{quote_value(key, 80)}] = {quote_value(entry)} is not a file name. {fix}"
            )
        if os.path.isabs(entry) or ".." in Path(entry).parts:
            raise ValueError(
                f"{index}: weight_map[{quote_value(key, 80)}] = {quote_value(entry, 120)} points outside the index's "
                f"folder {str(index.parent)!r}; nothing was read from it. Shard files must be names relative to "
                "the index, inside its folder (e.g. 'model-00001-of-00002.safetensors'). Fix: correct the index "
                "or re-save the checkpoint."
            )
    return [str(index.parent / name) for name in dict.fromkeys(weight_map.values())]


def _device_resolver(device_map: dict[str, object] | None):
    cache: dict[str, object] = {}

    def resolve(name: str) -> object:
        if device_map is None:
            return "cpu"
        probe = name
        while probe not in device_map:
            if probe in cache:
                return cache[probe]
            if not probe:
                raise ValueError(
                    f"{name!r} is not covered by the device_map; add an entry for it or for a parent."
                )
            probe = probe.rpartition(".")[0]
        if probe != name:
            cache[name.rpartition(".")[0]] = device_map[probe]
        return device_map[probe]

    return resolve


@contextmanager
def _safetensors_errors(path: str) -> Iterator[None]:
    """Re-raise the safetensors library's errors on a damaged file as a ValueError naming the file."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        raise ValueError(
            f"{path} is not a valid safetensors file ({quote_value(str(err), 200)}). Fix: re-download or re-save "
            "the checkpoint (it is truncated, damaged or not a safetensors file)."
        ) from None


def _torch_load(path: str, mmap: bool = False) -> Mapping[str, torch.Tensor]:
    """``torch.load`` with ``weights_only=True`` (never anything else): a file holding other objects is
    refused with a message naming the file, what it holds and the fix."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        what = f"an object of type {found.group(1)}" if found else "objects other than tensors"
        raise ValueError(
            f"{path} holds {what}, which torch.load(weights_only=True) refuses: unpickling it could run code, "
            "and big-model loading never does. Fix: save the weights as safetensors (or as a plain dict of "
            "tensors); if you trust the file and the type is harmless, allow it first with "
            "torch.serialization.add_safe_globals([...])."
        ) from None
    if not isinstance(state, Mapping):
        raise ValueError(
            f"{path} holds a {type(state).__name__}, not a state dict (name -> tensor). Fix: pass a weights file."
        )
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"{path}: {quote_value(name, 80)} is a {type(tensor).__name__}, not a tensor. Fix: pass a weights "
                "file holding only tensors (a state dict)."
            )
    return state


def _iter_file(path: str, device_for) -> Iterator[tuple[str, torch.Tensor | None, tuple[str, dict] | None]]:
    """Yield ``(name, tensor, in_place)``; for names kept on disk in place the tensor is None and
    ``in_place`` is ``(safetensors path, header entry)``."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        header, _ = read_safetensors_header(path)
        with _safetensors_errors(path), safe_open(path, framework="pt", device="cpu") as handle:
            for name in header:
                if device_for(name) == "disk" and header[name]["dtype"] in SAFETENSORS_DTYPES:
                    yield name, None, (path, header[name])
                else:
                    yield name, handle.get_tensor(name), None
        return
    state = _torch_load(path, mmap=True)
    for name, tensor in state.items():
        # A memory-mapped tensor kept as a CPU parameter would alias the file: copy it out once.
        yield name, (tensor.clone() if device_for(name) == "cpu" else tensor), None


def load_state_dict(
    checkpoint_file: str | os.PathLike, device_map: dict[str, object] | None = None
) -> dict[str, torch.Tensor]:
    """Load one weights file into a dict, placing each tensor on its device from ``device_map``.

    Args:
        checkpoint_file: a ``.safetensors`` or torch pickle (``.bin``) file.
        device_map: if given, each tensor goes to the device of its longest matching entry
            (tensors mapped to ``"disk"`` stay on CPU).

    Returns:
        The state dict.

    Raises:
        ValueError: a damaged file, a ``.bin`` holding anything but tensors (it is read with
            ``weights_only=True``), or a device this machine does not have.
    """
    path = str(checkpoint_file)
    _check_map_devices(device_map)
    resolve = _device_resolver(device_map)
    result: dict[str, torch.Tensor] = {}
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        # The header's claims are checked against the file before the library reads it.
        read_safetensors_header(path)
        with _safetensors_errors(path), safe_open(path, framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                device = resolve(name)
                tensor = handle.get_tensor(name)
                result[name] = tensor if device in ("cpu", "disk") else tensor.to(to_torch_device(device))
        return result
    state = _torch_load(path)
    for name, tensor in state.items():
        device = resolve(name)
        result[name] = tensor if device in ("cpu", "disk") else tensor.to(to_torch_device(device))
    return result


def _check_map_devices(device_map: Mapping[str, object] | None) -> None:
    """Every device a map names must exist here: checked before a single file is read."""
    if isinstance(device_map, Mapping):
        for name, device in device_map.items():
            check_device_visible(device, f"device_map[{name!r}]")


def _keeps_fp32(name: str, keep_in_fp32_modules: list[str]) -> bool:
    return any(f".{module}." in f".{name}." for module in keep_in_fp32_modules)


def _is_dtensor(tensor: object) -> bool:
    return type(tensor).__name__ == "DTensor" or "DTensor" in (c.__name__ for c in type(tensor).__mro__)


class _Loader:
    """One checkpoint load: the bookkeeping shared by every tensor."""

    def __init__(self, model, device_map, offload_folder, dtype, offload_buffers, keep_in_fp32_modules):
        self.model = model
        self.resolve = _device_resolver(device_map)
        self.offload_folder = offload_folder
        self.dtype = parse_dtype(dtype)
        self.keep_fp32 = list(keep_in_fp32_modules or [])
        self.buffers = {name for name, _ in model.named_buffers()}
        self.offload_buffers = offload_buffers
        self.expected = set(model.state_dict().keys())
        self.loaded: set[str] = set()
        self.unexpected: list[str] = []
        self.index: dict[str, dict] = {}
        self.devices: dict[object, torch.device] = {}
        self.full_state_dict = True
        self.checkpoint = ""
        # Parameters already sharded across processes (FSDP2 / tensor parallel DTensors).
        self.sharded = {name: t for name, t in model.state_dict(keep_vars=True).items() if _is_dtensor(t)}

    def cast_for(self, name: str, tensor_dtype: torch.dtype) -> torch.dtype | None:
        if not tensor_dtype.is_floating_point:
            return None
        if self.keep_fp32 and _keeps_fp32(name, self.keep_fp32):
            return torch.float32
        return self.dtype if isinstance(self.dtype, torch.dtype) else None

    def place(self, name: str, tensor: torch.Tensor | None, source: tuple[str, dict] | None) -> None:
        if name not in self.expected:
            self.unexpected.append(name)
            return
        if name in self.sharded:
            self.place_sharded(name, tensor, source)
            return
        device = self.resolve(name)
        if device == "disk" and name in self.buffers and not self.offload_buffers:
            device = "cpu"  # buffers of offloaded modules stay in memory unless asked otherwise
        if device == "disk":
            self.to_disk(name, tensor, source)
        else:
            if tensor is None:
                tensor = safetensors_view(source[0], name).clone()
            if device not in self.devices:
                self.devices[device] = to_torch_device(device)
            set_module_tensor_to_device(
                self.model, name, self.devices[device], value=tensor, dtype=self.cast_for(name, tensor.dtype)
            )
        self.loaded.add(name)

    def place_sharded(self, name: str, tensor: torch.Tensor | None, source: tuple[str, dict] | None) -> None:
        """Fill a DTensor parameter: from the full tensor (each process keeps its shard) or, with
        ``full_state_dict=False``, from a checkpoint that holds exactly this process's local shard."""
        if tensor is None:
            tensor = safetensors_view(source[0], name)
        current = self.sharded[name]
        local = current.to_local()
        if self.full_state_dict:
            from torch.distributed.tensor import distribute_tensor

            if tuple(tensor.shape) != tuple(current.shape):
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(current.shape)}"
                )
            # Every process read the full tensor: slice locally, no communication (src_data_rank=None).
            piece = distribute_tensor(
                tensor.to(device=local.device, dtype=local.dtype),
                current.device_mesh,
                current.placements,
                src_data_rank=None,
            ).to_local()
        else:
            if tuple(tensor.shape) != tuple(local.shape):
                raise ValueError(
                    f"{name}: full_state_dict=False expects this process's shard of shape {tuple(local.shape)}, "
                    f"the checkpoint holds {tuple(tensor.shape)}; pass full_state_dict=True for a full checkpoint"
                )
            piece = tensor
        with torch.no_grad():
            local.copy_(piece.to(device=local.device, dtype=local.dtype))
        self.loaded.add(name)

    def to_disk(self, name: str, tensor: torch.Tensor | None, source: tuple[str, dict] | None) -> None:
        if source is not None:
            path, entry = source
            stored = SAFETENSORS_DTYPES[entry["dtype"]]
            cast = self.cast_for(name, stored)
            self.index[name] = {
                "safetensors_file": os.path.abspath(path),
                "weight_name": name,
                "dtype": str(cast or stored).removeprefix("torch."),
                "shape": entry["shape"],
            }
            return
        if self.offload_folder is None:
            raise ValueError(f"{name!r} is mapped to 'disk': pass offload_folder to say where to write it.")
        cast = self.cast_for(name, tensor.dtype)
        offload_weight(
            tensor if cast is None else tensor.to(cast), name, self.offload_folder, index=self.index
        )

    def finish(self, strict: bool) -> tuple[list[str], list[str]]:
        if self.index:
            if self.offload_folder is None:
                raise ValueError(
                    "Some weights are mapped to 'disk': pass offload_folder to keep their index."
                )
            save_offload_index(self.index, self.offload_folder)
        missing = sorted(self.expected - self.loaded)
        if strict and (missing or self.unexpected):
            raise ValueError(
                f"The checkpoint {self.checkpoint} does not match the model: {len(missing)} missing key(s) "
                f"[{summarize_names(missing)}], {len(self.unexpected)} unexpected key(s) "
                f"[{summarize_names(self.unexpected)}]. Fix the checkpoint or model configuration, or pass "
                "strict=False."
            )
        if missing or self.unexpected:
            empty = set(tensors_on_meta(self.model))
            still_empty = [name for name in missing if name in empty]
            logger.warning(
                "Checkpoint %s loaded with missing keys [%s] and unexpected keys [%s].%s",
                self.checkpoint,
                summarize_names(missing),
                summarize_names(self.unexpected),
                f" {len(still_empty)} missing tensor(s) hold no data (still on the meta device) and must be set "
                "before the model runs."
                if still_empty
                else "",
            )
        return missing, list(self.unexpected)


def _tied_aliases(tied_params: list[list[str]]) -> dict[str, list[str]]:
    aliases: dict[str, list[str]] = {}
    for group in tied_params:
        for name in group:
            aliases[name] = [other for other in group if other != name]
    return aliases


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: dict[str, int | str | torch.device] | None = None,
    offload_folder: str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> tuple[list[str], list[str]]:
    """Load a checkpoint into a model (which may be empty, on ``meta``), tensor by tensor.

    Each tensor goes straight to its device from ``device_map``; tensors mapped to ``"disk"`` are
    written to ``offload_folder`` (or, when they already sit in a safetensors file with the right
    dtype, indexed in place without a copy) and an ``index.json`` is saved there.

    Args:
        model: the model to fill.
        checkpoint: a ``.safetensors``/``.bin`` file, a sharded checkpoint's ``*.index.json``, or a folder.
        device_map: module or tensor name -> device (``0``, ``"cuda:1"``, ``"cpu"``, ``"disk"``); all
            on CPU when None.
        offload_folder: where disk-mapped tensors and their index go (required if any are).
        dtype: cast floating-point weights to this dtype (integer tensors are never cast).
        offload_state_dict: accepted for compatibility; loading already streams one tensor at a time,
            so CPU weights are never held twice.
        offload_buffers: also send buffers of disk-mapped modules to disk (else they load on CPU).
        keep_in_fp32_modules: module names whose floating-point weights stay in float32.
        offload_8bit_bnb: accepted for compatibility; 8-bit weights are offloaded like any tensor.
        strict: raise if keys are missing or unexpected.
        full_state_dict: the checkpoint holds full (unsharded) tensors; DTensor parameters (FSDP2 /
            tensor parallel) keep their shard of each. ``False``: the checkpoint holds exactly this
            process's local shards of the DTensor parameters.
        broadcast_from_rank0: in a distributed run, only rank 0 reads the files and every rank
            receives the tensors by broadcast (all ranks must call this).

    Returns:
        ``(missing_keys, unexpected_keys)``.

    Raises:
        ValueError: for a missing or damaged checkpoint, a shard index naming files outside its folder,
            a ``.bin`` holding anything but tensors (read with ``weights_only=True``), a device this
            machine does not have, disk offload without ``offload_folder``, or, with ``strict=True``,
            a checkpoint that does not match the model.
    """
    del offload_state_dict, offload_8bit_bnb
    _check_map_devices(device_map)
    tied = find_tied_parameters(model)
    loader = _Loader(model, device_map, offload_folder, dtype, offload_buffers, keep_in_fp32_modules)
    loader.checkpoint = os.fspath(checkpoint)
    loader.full_state_dict = full_state_dict is not False
    if not loader.full_state_dict and not loader.sharded:
        raise ValueError(
            "full_state_dict=False loads per-process shards into DTensor parameters, but this model has none; "
            "shard it first (fully_shard / tensor parallel) or pass full_state_dict=True"
        )
    if broadcast_from_rank0 and torch.distributed.is_available() and torch.distributed.is_initialized():
        from accelerando.big_modeling.broadcast import broadcast_checkpoint

        broadcast_checkpoint(loader, lambda: checkpoint_files(checkpoint), _iter_file)
    else:
        from accelerando.utils.progress import progress

        for path in progress(checkpoint_files(checkpoint), desc="Loading checkpoint shards"):
            for name, tensor, source in _iter_file(path, loader.resolve):
                loader.place(name, tensor, source)
    aliases = _tied_aliases(tied)
    # A tied weight saved once (safetensors drops shared copies) also covers its other names.
    loader.loaded.update(alias for name in list(loader.loaded) for alias in aliases.get(name, ()))
    for name in list(loader.index):
        for alias in aliases.get(name, ()):
            loader.index.setdefault(alias, loader.index[name])
    retie_parameters(model, tied)
    return loader.finish(strict)


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: str | dict[str, int | str | torch.device] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load a checkpoint into an (empty) model and dispatch it over the available devices.

    Args:
        model: the model, usually built under :func:`~accelerando.big_modeling.init_empty_weights`.
        checkpoint: a weights file, a sharded checkpoint's ``*.index.json``, or a folder.
        device_map: a dict, or a strategy: ``"auto"``/``"balanced"`` (spread evenly over accelerators),
            ``"balanced_low_0"`` (keep accelerator 0 nearly free), ``"sequential"`` (fill in order).
            None loads everything on CPU without hooks.
        max_memory: budgets per device (bytes or strings like ``"10GiB"``); free memory when None.
        no_split_module_classes: class names never split across devices.
        offload_folder: folder for disk-offloaded weights.
        offload_buffers: offload buffers too.
        dtype: cast floating-point weights to this dtype.
        offload_state_dict: accepted for compatibility (loading already streams tensor by tensor).
        skip_keys: input/output dict keys never moved.
        preload_module_classes: class names whose submodules' weights load together.
        force_hooks: attach hooks even for a single-device map.
        strict: raise if the checkpoint's keys do not match the model's.
        full_state_dict: see :func:`load_checkpoint_in_model`.
        broadcast_from_rank0: read on rank 0 only and broadcast (distributed runs).

    Returns:
        The loaded, dispatched model.

    Raises:
        ValueError: for an unknown device-map strategy, for tensors of the model the checkpoint does not
            hold (they would stay without data), and see :func:`load_checkpoint_in_model` and
            :func:`~accelerando.big_modeling.dispatch_model`.
    """
    strategies = ("auto", "balanced", "balanced_low_0", "sequential")
    if isinstance(device_map, str):
        if device_map not in strategies:
            raise ValueError(f"device_map must be a dict or one of {strategies}, got {device_map!r}.")
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model,
                max_memory,
                no_split_module_classes,
                dtype=dtype,
                low_zero=device_map == "balanced_low_0",
            )
        device_map = infer_auto_device_map(
            model, max_memory=max_memory, no_split_module_classes=no_split_module_classes, dtype=dtype,
            offload_buffers=offload_buffers,
        )  # fmt: skip
    missing, _ = load_checkpoint_in_model(
        model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
        offload_state_dict=bool(offload_state_dict), offload_buffers=offload_buffers, strict=strict,
        full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0,
    )  # fmt: skip
    _refuse_unloaded(model, missing, checkpoint)
    if device_map is None:
        return model
    return dispatch_model(
        model, device_map, offload_dir=offload_folder, offload_buffers=offload_buffers, skip_keys=skip_keys,
        preload_module_classes=preload_module_classes, force_hooks=force_hooks,
    )  # fmt: skip


def _refuse_unloaded(model: nn.Module, missing: list[str], checkpoint: str | os.PathLike) -> None:
    """A tensor the checkpoint did not fill and that is still on ``meta`` makes the model unusable."""
    wanted = set(missing)
    unloaded = [name for name in tensors_on_meta(model) if name in wanted]  # in module order
    if unloaded:
        raise ValueError(
            f"{len(unloaded)} parameter(s)/buffer(s) of the model were not found in the checkpoint "
            f"{os.fspath(checkpoint)!r} and hold no data (still on the meta device): {summarize_names(unloaded)}. "
            "Fix: check that the checkpoint matches the model (same class and configuration; strict=True lists "
            "every missing and unexpected key), or create these tensors outside init_empty_weights so they "
            "keep their initial values."
        )
