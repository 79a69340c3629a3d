"""Checkpoints across strategies: read any layout ``save_state`` writes into one portable form, apply it.

Every checkpoint records its layout in the manifest (``extra["layout"]``, see
:meth:`Strategy.checkpoint_layout`): ``"full"`` (one full weights file per model, the optimizer's
``state_dict`` keyed by parameter index or by name), ``"dcp"`` (torch.distributed.checkpoint folders,
any number of processes) or ``"deepspeed"`` (a DeepSpeed engine checkpoint, ZeRO stage and process
count). A strategy that cannot read a layout natively (DDP given FSDP shards, FSDP given a DeepSpeed
checkpoint, DeepSpeed given another stage or process count...) reads it here into a
:class:`PortableState` per model (full weights and the optimizer state keyed by parameter name), checks
it against the live model before anything is applied, and then applies it its own way. A layout no
converter reads is refused before anything is read, in one line naming it and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, cast

import torch

from accelerando.checkpointing import files as F

__all__ = [
    "READABLE_FORMATS",
    "NamedOptimizerState",
    "group_names",
    "CheckpointConversionError",
    "Conversion",
    "PortableState",
    "check_optimizer",
    "apply_plain",
    "check_portable",
    "existing_folder",
    "names_of",
    "optimizer_names",
    "plain_layout",
    "read_portable",
    "to_indexed",
]

READABLE_FORMATS = ("full", "dcp", "deepspeed")


class CheckpointConversionError(ValueError):
    """A checkpoint's layout cannot be converted to the loading strategy's; nothing was applied."""


class NamedOptimizerState(TypedDict):
    """An optimizer's full state keyed by parameter name (``get_optimizer_state_dict``'s full form).

    Attributes:
        state: ``{name: {key: value}}`` (``exp_avg``, ``step``...).
        param_groups: The groups' hyperparameters, each with ``"params"``: its parameters' names.
    """

    state: dict[str, dict[str, object]]
    param_groups: list[dict[str, object]]


def group_names(group: Mapping[str, object]) -> list[str]:
    """The parameter names of one group of a :class:`NamedOptimizerState`."""
    return [str(name) for name in cast("list[object]", group["params"])]


@dataclass
class PortableState:
    """One model's weights and its optimizer's state, full (unsharded) and keyed by parameter name.

    Attributes:
        weights: Full tensors by state-dict name (parameters and buffers).
        optimizer: ``{"state": {name: {key: value}}, "param_groups": [{..., "params": [names]}]}``
            (the form of ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` with
            full state dicts), or None when the checkpoint has no optimizer for this model.
    """

    weights: dict[str, torch.Tensor]
    optimizer: NamedOptimizerState | None = None


@dataclass
class Conversion:
    """A conversion planned for one folder, then read (per model / optimizer index) before applying."""

    folder: str
    layout: Mapping[str, object]
    saved_world: int
    states: list[PortableState] = field(default_factory=lambda: list[PortableState]())


def plain_layout(
    strategy: str, models: Sequence[torch.nn.Module], optimizers: Sequence[object]
) -> dict[str, object]:
    """The ``"full"`` layout with index-keyed optimizers, and each optimizer's parameter names in order.

    The names let another strategy key the saved ``optimizer.bin`` (torch's indices) by name.
    """
    return {
        "strategy": strategy,
        "format": "full",
        "optimizer_keys": "index",
        "optimizer_params": [optimizer_names(models, opt) for opt in optimizers],
    }


def names_of(models: Sequence[torch.nn.Module]) -> list[dict[int, str]]:
    """For each model, ``id(parameter) -> name`` without wrapper prefixes (DDP, FSDP1, compile)."""
    return [{id(p): _clean(n) for n, p in _plain(model).named_parameters()} for model in models]


def _plain(model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    inner = model.module if isinstance(model, DistributedDataParallel) else model
    # torch 2.13: torch/_dynamo/eval_frame.py:459 (private; OptimizedModule._orig_mod is the compiled module)
    return getattr(inner, "_orig_mod", inner)


def optimizer_names(models: Sequence[torch.nn.Module], optimizer: object) -> list[list[str]]:
    """The parameter names of each of ``optimizer``'s groups (``"?"`` for a parameter of no model)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    groups = getattr(inner, "param_groups", [])
    maps = names_of(models)
    found = next((m for m in maps if any(id(p) in m for g in groups for p in g["params"])), {})
    return [[found.get(id(p), "?") for p in g["params"]] for g in groups]


_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def _clean(name: str) -> str:
    for prefix in _PREFIXES:
        name = name.replace(prefix, "")
    return name


def describe(layout: Mapping[str, object], world: int) -> str:
    """Words for a layout in messages, e.g. ``deepspeed ZeRO-3 on 4 processes``."""
    strategy = str(layout.get("strategy", layout.get("format", "?")))
    if layout.get("format") == "deepspeed":
        strategy = f"deepspeed ZeRO-{layout.get('zero_stage', '?')}"
    elif layout.get("format") == "dcp":
        strategy = f"{strategy} (sharded DCP)"
    return f"{strategy} on {world} process{'es' if world != 1 else ''}"


def refuse_unreadable(folder: str, layout: Mapping[str, object], world: int, target: str) -> None:
    """Raise the one-line refusal when no converter reads ``layout``.

    Raises:
        CheckpointConversionError: When the layout's format is not one of :data:`READABLE_FORMATS`.
    """
    if layout.get("format") in READABLE_FORMATS:
        return
    raise CheckpointConversionError(
        f"Cannot load {folder!r} under {target}: it was saved under {describe(layout, world)}, and no "
        f"conversion from that layout exists (accelerando converts {', '.join(READABLE_FORMATS)} "
        "checkpoints); load it under the strategy and process count that saved it, then save it again "
        "under a convertible one (e.g. FSDP with SHARDED_STATE_DICT)."
    )


# Readers of the layouts their strategies own, by format ("module:function", imported on first use so
# this module imports no strategy: the strategies import it).
_READERS = {
    "dcp": "accelerando.backends.strategies.fsdp.state:read_dcp_portable",
    "deepspeed": "accelerando.backends.strategies.deepspeed.convert:read_deepspeed",
}


def read_portable(conversion: Conversion, num_models: int, num_optimizers: int) -> list[PortableState]:
    """Read every model's and optimizer's state of the planned folder into portable form.

    Raises:
        FileNotFoundError: A model's or optimizer's files are missing.
        CheckpointConversionError: The files hold something no conversion understands.
        UnsafeCheckpointError: A file needs full unpickling without the caller's opt-in.
    """
    import importlib

    layout, folder = conversion.layout, conversion.folder
    found = _READERS.get(str(layout.get("format")))
    if found is not None:
        module, name = found.split(":")
        reader = getattr(importlib.import_module(module), name)
        return reader(folder, layout, conversion.saved_world, num_models, num_optimizers)
    full = _reader_full(layout)
    return [full(folder, i, i < num_optimizers) for i in range(max(num_models, num_optimizers))]


def existing_folder(folder: str, name: str) -> str:
    """``folder/name``, which must be a folder (a model or optimizer saved as DCP shards).

    Raises:
        FileNotFoundError: It is missing (fewer models or optimizers were saved).
    """
    path = os.path.join(folder, name)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"Checkpoint {folder!r} has no {name!r} folder: pass the same models to load_state as to save_state."
        )
    return path


def _reader_full(layout: Mapping[str, object]) -> Callable[[str, int, bool], PortableState]:
    params = layout.get("optimizer_params")

    def read(folder: str, index: int, with_optimizer: bool) -> PortableState:
        weights = dict(F.load_model_weights(F.find_model_file(folder, index)))
        if not with_optimizer:
            return PortableState(weights)
        path = os.path.join(folder, F.indexed(F.OPTIMIZER_NAME, index, ".bin"))
        loaded = F.torch_load(path, "cpu")
        if not isinstance(loaded, dict) or "state" not in loaded or "param_groups" not in loaded:
            raise CheckpointConversionError(
                f"{path!r} is not an optimizer state_dict (no 'state' / 'param_groups')"
            )
        state = cast("NamedOptimizerState", loaded)
        if layout.get("optimizer_keys") == "name":
            return PortableState(weights, state)
        names = params[index] if isinstance(params, list) and index < len(params) else None
        return PortableState(weights, _to_named(state, names, path))

    return read


def _to_named(indexed: Mapping[str, object], names: object, path: str) -> NamedOptimizerState:
    """Torch's index-keyed optimizer state to name-keyed, with the names recorded at save time."""
    groups = cast("list[dict[str, object]]", indexed["param_groups"])
    state = cast("dict[int, dict[str, object]]", indexed["state"])
    counts = [len(cast("list[int]", g["params"])) for g in groups]
    if not isinstance(names, list) or [len(cast("list[str]", g)) for g in names] != counts:
        raise CheckpointConversionError(
            f"{path!r} keys its optimizer state by parameter index and the manifest does not name the "
            "parameters of each group; load it under the strategy that saved it (single process or DDP)."
        )
    listed = cast("list[list[str]]", names)
    by_index = {
        i: n
        for g, saved in zip(groups, listed, strict=True)
        for i, n in zip(cast("list[int]", g["params"]), saved, strict=True)
    }
    return {
        "state": {by_index[i]: dict(s) for i, s in state.items()},
        "param_groups": [{**g, "params": list(n)} for g, n in zip(groups, listed, strict=True)],
    }


def check_portable(
    portable: PortableState, expected: Mapping[str, torch.Size], folder: str, index: int
) -> None:
    """Refuse, before anything is applied, state whose names or shapes differ from the live model's.

    Raises:
        CheckpointConversionError: Naming the first missing, unexpected or differently shaped entry.
    """
    missing = sorted(set(expected) - set(portable.weights))
    unexpected = sorted(set(portable.weights) - set(expected))
    if missing or unexpected:
        what = f"lacks {missing[0]!r}" if missing else f"has {unexpected[0]!r}, which the model lacks"
        raise CheckpointConversionError(
            f"{folder!r}: model {index}'s saved state {what} ({len(missing)} missing, {len(unexpected)} "
            "unexpected): pass the same model to load_state as to save_state."
        )
    for name, shape in expected.items():
        got = tuple(portable.weights[name].shape)
        if got != tuple(shape):
            raise CheckpointConversionError(
                f"{folder!r}: model {index}'s {name!r} was saved with shape {got} and the model has "
                f"{tuple(shape)}: pass the same model to load_state as to save_state."
            )


def check_optimizer(portable: PortableState, names: list[list[str]], folder: str, index: int) -> None:
    """Refuse, before anything is applied, saved optimizer groups that hold other parameters than ``names``.

    Raises:
        CheckpointConversionError: Naming the optimizer and what differs.
    """
    if portable.optimizer is not None:
        to_indexed(portable.optimizer, names, f"{folder}' (optimizer {index})")


def to_indexed(optimizer: NamedOptimizerState, names: list[list[str]], folder: str) -> dict[str, object]:
    """Name-keyed optimizer state to torch's index-keyed ``state_dict`` for an optimizer whose groups hold
    parameters named ``names`` (saved groups matched in order; their hyperparameters are restored).

    Raises:
        CheckpointConversionError: The saved groups do not hold the same parameters.
    """
    saved = optimizer["param_groups"]
    if [sorted(group_names(g)) for g in saved] != [sorted(n) for n in names]:
        raise CheckpointConversionError(
            f"{folder!r}: the optimizer's parameter groups differ from the saved ones; build the "
            "optimizer over the same parameters, in the same groups, as when saving."
        )
    index = {name: i for i, name in enumerate(n for group in names for n in group)}
    return {
        "state": {index[n]: dict(s) for n, s in optimizer["state"].items() if n in index},
        "param_groups": [
            {**g, "params": [index[n] for n in group]} for g, group in zip(saved, names, strict=True)
        ],
    }


def apply_plain(
    conversion: Conversion, models: Sequence[torch.nn.Module], optimizers: Sequence[object]
) -> None:
    """Apply portable state to plain modules and torch optimizers (one process, DDP)."""
    for model, portable in zip(models, conversion.states, strict=False):
        _plain(model).load_state_dict(portable.weights, strict=True)
    for i, optimizer in enumerate(optimizers):
        portable = conversion.states[i]
        if portable.optimizer is None:
            continue
        inner = cast("torch.optim.Optimizer", getattr(optimizer, "optimizer", optimizer))
        names = optimizer_names(models, inner)
        inner.load_state_dict(to_indexed(portable.optimizer, names, conversion.folder))


def plain_shapes(model: torch.nn.Module) -> dict[str, torch.Size]:
    """The full shape of every state-dict entry of a plain (or DDP-wrapped) module."""
    return {_clean(k): v.shape for k, v in _plain(model).state_dict().items()}
