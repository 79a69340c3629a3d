"""Load checkpoints into (possibly empty) models, one tensor at a time, straight to their device.

Peak memory while loading is the model's own placed weights plus one tensor: tensors are read from
the file directly into the memory that becomes the parameter (no whole-state-dict copy), and
tensors mapped to ``"disk"`` that already sit in a safetensors file are indexed in place instead of
being rewritten. :func:`load_checkpoint_and_dispatch` adds the usual next steps: plan a device map,
load, then dispatch the model over it with hooks.

The steps live in their own modules: :mod:`~accelerando.big_modeling.discovery` finds the weight
files, :mod:`~accelerando.big_modeling.reading` reads them tensor by tensor and
:mod:`~accelerando.big_modeling.placement` puts each tensor where the device map says; this module
runs them in order and handles tied weights and the final checks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from torch import nn

from accelerando.big_modeling.broadcast import broadcast_checkpoint
from accelerando.big_modeling.budgets import DeviceKey, DeviceLike, get_balanced_memory
from accelerando.big_modeling.device_map import infer_auto_device_map
from accelerando.big_modeling.discovery import checkpoint_files
from accelerando.big_modeling.dispatch import dispatch_model
from accelerando.big_modeling.placement import CheckpointLoader
from accelerando.big_modeling.reading import check_map_devices, iter_checkpoint_file, load_state_dict
from accelerando.big_modeling.tensors import (
    find_tied_parameters,
    retie_parameters,
    summarize_names,
    tensors_on_meta,
)
from accelerando.common.progress import progress

__all__ = ["checkpoint_files", "load_checkpoint_and_dispatch", "load_checkpoint_in_model", "load_state_dict"]


def _tied_aliases(tied_params: list[list[str]]) -> dict[str, list[str]]:
    aliases: dict[str, list[str]] = {}
    for group in tied_params:
        for name in group:
            aliases[name] = [other for other in group if other != name]
    return aliases


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike,
    device_map: Mapping[str, DeviceLike] | None = None,
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

    Example:
        >>> import torch
        >>> from safetensors.torch import save_file
        >>> from accelerando import init_empty_weights, load_checkpoint_in_model
        >>> save_file(torch.nn.Linear(4, 2).state_dict(), "weights.safetensors")
        >>> with init_empty_weights():
        ...     model = torch.nn.Linear(4, 2)
        >>> load_checkpoint_in_model(model, "weights.safetensors")  # (missing keys, unexpected keys)
        ([], [])
        >>> model.weight.device
        device(type='cpu')
    """
    del offload_state_dict, offload_8bit_bnb
    check_map_devices(device_map)
    tied = find_tied_parameters(model)
    loader = CheckpointLoader(model, device_map, offload_folder, dtype, offload_buffers, keep_in_fp32_modules)
    loader.checkpoint = os.fspath(checkpoint)
    loader.full_state_dict = full_state_dict is not False
    if not loader.full_state_dict and not loader.sharded:
        raise ValueError(
            "full_state_dict=False loads per-process shards into DTensor parameters, but this model has none; "
            "shard it first (fully_shard / tensor parallel) or pass full_state_dict=True"
        )
    if broadcast_from_rank0 and torch.distributed.is_available() and torch.distributed.is_initialized():
        broadcast_checkpoint(loader, lambda: checkpoint_files(checkpoint), iter_checkpoint_file)
    else:
        for path in progress(checkpoint_files(checkpoint), desc="Loading checkpoint shards"):
            for name, tensor, source in iter_checkpoint_file(path, loader.resolve):
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
    device_map: str | Mapping[str, DeviceLike] | None = None,
    max_memory: Mapping[DeviceKey, int | float | str] | None = None,
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

    Example:
        >>> import torch
        >>> from safetensors.torch import save_file
        >>> from accelerando import init_empty_weights, load_checkpoint_and_dispatch
        >>> save_file(torch.nn.Linear(4, 2).state_dict(), "weights.safetensors")
        >>> with init_empty_weights():
        ...     model = torch.nn.Linear(4, 2)
        >>> model = load_checkpoint_and_dispatch(model, "weights.safetensors", device_map="auto")
        >>> model.weight.device  # on a GPU machine: the first GPU
        device(type='cpu')
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
        planned: Mapping[str, DeviceLike] | None = infer_auto_device_map(
            model, max_memory=max_memory, no_split_module_classes=no_split_module_classes, dtype=dtype,
            offload_buffers=offload_buffers,
        )  # fmt: skip
    else:
        planned = device_map
    missing, _ = load_checkpoint_in_model(
        model, checkpoint, device_map=planned, offload_folder=offload_folder, dtype=dtype,
        offload_state_dict=bool(offload_state_dict), offload_buffers=offload_buffers, strict=strict,
        full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0,
    )  # fmt: skip
    _refuse_unloaded(model, missing, checkpoint)
    if planned is None:
        return model
    return dispatch_model(
        model, planned, offload_dir=offload_folder, offload_buffers=offload_buffers, skip_keys=skip_keys,
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
