"""DeepSpeed ZeRO checkpoints to and from the portable form (full weights, name-keyed optimizer state).

Reading consolidates the per-rank ZeRO files of any stage and process count the way DeepSpeed's
``zero_to_fp32`` consolidates weights, and does the same for every per-element optimizer state
(``exp_avg``, ``exp_avg_sq``...): ZeRO-1/2 partitions one flat vector per parameter group across the
ranks (``param_slice_mappings`` says where each parameter's piece lies), ZeRO-3 partitions each
parameter on its own (``ceil(numel / world)`` elements per rank, in ``param_shapes`` order). Files are
read weights-only (with the few DeepSpeed types they hold allowed).

Applying writes the live engine's own partitions: the module's weights (gathered under ZeRO-3), the fp32
master pieces and the base optimizer's per-partition state, for any stage and process count.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

from accelerando.backends.strategies.conversion import (
    CheckpointConversionError,
    NamedOptimizerState,
    PortableState,
)
from accelerando.checkpointing import files as F

__all__ = ["apply_deepspeed", "read_deepspeed"]

# Types DeepSpeed's checkpoint files hold; rebuilding them runs no code of the file's choosing.
_SAFE = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def _load(path: str) -> dict[str, object]:
    safe = []
    for module, name in _SAFE:
        with contextlib.suppress(ImportError, AttributeError):
            safe.append(getattr(importlib.import_module(module), name))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"DeepSpeed checkpoint file {path!r} is missing; was the folder copied whole?"
        )
    with torch.serialization.safe_globals(safe):
        loaded = F.torch_load(path, "cpu")
    if not isinstance(loaded, dict):
        raise CheckpointConversionError(f"{path!r} is not a DeepSpeed checkpoint file (not a dict)")
    return cast("dict[str, object]", loaded)


class _Zero(Protocol):
    """The parts of DeepSpeed's ZeRO optimizer (stage 1/2 or 3) that a conversion writes."""

    optimizer: torch.optim.Optimizer
    grad_position: dict[int, list[int]]  # ZeRO-3: parameter id -> (sub-group, offset, numel)
    dp_process_group: ProcessGroup | None
    bit16_groups: list[list[torch.nn.Parameter]]  # ZeRO-1/2

    def get_param_id(self, param: torch.nn.Parameter) -> int:
        """ZeRO-3: the parameter's id in ``grad_position``."""
        ...

    def _lazy_init_hp_params_optimizer_state(self) -> None:
        """ZeRO-1/2: map each parameter's optimizer-state pieces (DeepSpeed does it after a step)."""
        ...


class _Address(Protocol):
    """DeepSpeed's ``fragment_address``: where a parameter's piece lies in a flat partition."""

    start: int
    numel: int


@dataclass
class _Rank:
    """What a conversion reads of one rank's ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``.

    Attributes:
        flats: The fp32 partition of each (sub-)group.
        state: The base optimizer's state of each (sub-)group's partition.
        groups: The base optimizer's param groups (hyperparameters).
        slices: ZeRO-1/2: per group, name -> (start, numel) of the parameter's piece in the partition.
    """

    flats: list[torch.Tensor]
    state: dict[int, dict[str, torch.Tensor]]
    groups: list[dict[str, object]]
    slices: list[dict[str, tuple[int, int]]]


def _rank(tag: str, rank: int) -> _Rank:
    saved = cast(
        "dict[str, object]",
        _load(os.path.join(tag, f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"))["optimizer_state_dict"],
    )
    if "single_partition_of_fp32_groups" in saved:  # ZeRO-1/2
        base = cast("dict[str, object]", saved["base_optimizer_state"])
        flats = cast("list[torch.Tensor]", saved["single_partition_of_fp32_groups"])
        mappings = cast("list[dict[str, object]]", saved["param_slice_mappings"])
        slices = [
            {n: (int(a.start), int(a.numel)) for n, a in cast("dict[str, _Address]", m).items()}
            for m in mappings
        ]
    else:  # ZeRO-3
        base = cast("dict[str, object]", saved["optimizer_state_dict"])
        flats, slices = cast("list[torch.Tensor]", saved["fp32_flat_groups"]), []
    state = cast("dict[int, dict[str, torch.Tensor]]", base["state"])
    return _Rank(list(flats), state, cast("list[dict[str, object]]", base["param_groups"]), slices)


def _shapes(model: Mapping[str, object]) -> list[dict[str, tuple[int, ...]]]:
    return [
        {n: tuple(int(d) for d in s) for n, s in g.items()}
        for g in cast("list[dict[str, torch.Size]]", model["param_shapes"])
    ]


def _tag(index: int) -> str:
    return "pytorch_model" if index == 0 else f"pytorch_model_{index}"


def read_deepspeed(
    folder: str, layout: Mapping[str, object], world: int, num_models: int, num_optimizers: int
) -> list[PortableState]:
    """Consolidate a DeepSpeed engine checkpoint (one per model) into portable states.

    Raises:
        CheckpointConversionError: An unknown ZeRO stage, frozen ZeRO-3 parameters, or pieces that do
            not add up to the recorded shapes.
        FileNotFoundError: A rank's file is missing.
    """
    stage = int(str(layout.get("zero_stage", 0)))
    out = []
    for index in range(max(num_models, num_optimizers)):
        tag = os.path.join(folder, _tag(index))
        if stage in (0, 1, 2):
            out.append(_read_zero12(tag, world))
        elif stage == 3:
            out.append(_read_zero3(tag, world))
        else:
            raise CheckpointConversionError(
                f"{folder!r}: unknown DeepSpeed ZeRO stage {stage}; load it under DeepSpeed."
            )
    return out


def _read_zero12(tag: str, world: int) -> PortableState:
    model = _load(os.path.join(tag, "mp_rank_00_model_states.pt"))
    ranks = [_rank(tag, r) for r in range(world)]
    weights = dict(cast("dict[str, torch.Tensor]", model["module"]))
    state: dict[str, dict[str, object]] = {}
    groups: list[dict[str, object]] = []
    for g, shapes in enumerate(_shapes(model)):
        base = [r.state.get(g, {}) for r in ranks]
        # Per-element state (exp_avg...): flat like the partition (which a save may store unpadded).
        keys = [k for k, v in base[0].items() if v.dim() == 1]
        for name, shape in shapes.items():
            pieces = [(r, ranks[r].slices[g][name]) for r in range(world) if name in ranks[r].slices[g]]
            weights[name] = _join([ranks[r].flats[g].narrow(0, *a) for r, a in pieces], shape, name)
            entry: dict[str, object] = {
                k: _join([base[r][k].narrow(0, *a) for r, a in pieces], shape, name) for k in keys
            }
            entry.update({k: v.clone() for k, v in base[0].items() if k not in keys})  # e.g. step
            state[name] = entry
        groups.append({**_hyper(ranks[0].groups[g]), "params": list(shapes)})
    return PortableState(weights, {"state": state, "param_groups": groups})


def _read_zero3(tag: str, world: int) -> PortableState:
    model = _load(os.path.join(tag, "zero_pp_rank_0_mp_rank_00_model_states.pt"))
    if model.get("frozen_param_shapes"):
        raise CheckpointConversionError(
            f"{tag!r}: a ZeRO-3 checkpoint with frozen parameters is not converted; load it under "
            "DeepSpeed ZeRO-3 on the same number of processes."
        )
    ranks = [_rank(tag, r) for r in range(world)]
    buffers = set(cast("list[str]", model.get("buffer_names") or []))
    weights = {k: v for k, v in cast("dict[str, torch.Tensor]", model["module"]).items() if k in buffers}
    flats = [torch.cat(r.flats) for r in ranks]
    first = ranks[0].state.get(0, {})
    keys = [k for k, v in first.items() if v.dim() == 1]
    # Each sub-group's state cut to its saved partition (a state may be padded beyond it).
    states = {
        k: [torch.cat([r.state[g][k][: f.numel()] for g, f in enumerate(r.flats)]) for r in ranks]
        for k in keys
    }
    hyper = [_hyper(g) for g in ranks[0].groups]
    if any(h != hyper[0] for h in hyper):
        raise CheckpointConversionError(
            f"{tag!r}: a ZeRO-3 checkpoint with several parameter groups is not converted; load it under "
            "DeepSpeed ZeRO-3 on the same number of processes."
        )
    state: dict[str, dict[str, object]] = {}
    offset, names = 0, []
    for shapes in _shapes(model):
        for name, shape in shapes.items():
            part = math.ceil(math.prod(shape) / world)
            weights[name] = _join([f.narrow(0, offset, part) for f in flats], shape, name, pad=True)
            entry: dict[str, object] = {
                k: _join([s.narrow(0, offset, part) for s in v], shape, name, pad=True)
                for k, v in states.items()
            }
            entry.update({k: v.clone() for k, v in first.items() if k not in keys})  # e.g. step
            state[name] = entry
            offset += part
            names.append(name)
    if offset != flats[0].numel():
        raise CheckpointConversionError(
            f"{tag!r}: the ZeRO-3 partitions hold {flats[0].numel()} elements, the shapes {offset}"
        )
    return PortableState(weights, {"state": state, "param_groups": [{**hyper[0], "params": names}]})


def _join(pieces: list[torch.Tensor], shape: tuple[int, ...], name: str, pad: bool = False) -> torch.Tensor:
    full = torch.cat(pieces) if pieces else torch.empty(0)
    numel = math.prod(shape)
    if full.numel() < numel or (full.numel() != numel and not pad):
        raise CheckpointConversionError(
            f"DeepSpeed pieces of {name!r} hold {full.numel()} elements, its shape {shape} needs {numel}"
        )
    return full[:numel].clone().view(shape)


def _hyper(group: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in group.items() if k != "params"}


@torch.no_grad()
def apply_deepspeed(
    engine: torch.nn.Module,
    portable: PortableState,
    load_weights: Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], object],
) -> None:
    """Write ``portable`` into ``engine``: module weights, fp32 master pieces, base optimizer state.

    Args:
        engine: A ``DeepSpeedEngine`` built with its optimizer (any ZeRO stage, any process count).
        portable: What to load (full tensors by name).
        load_weights: Loads the module's weights into the engine (gathered under ZeRO-3).
    """
    load_weights(engine, portable.weights)
    zero = cast("_Zero", engine.optimizer)
    module = cast("torch.nn.Module", engine.module)
    stage3 = hasattr(zero, "fp32_partitioned_groups_flat")
    flats = cast(
        "list[torch.Tensor]",
        getattr(zero, "fp32_partitioned_groups_flat" if stage3 else "single_partition_of_fp32_groups"),
    )
    optim: NamedOptimizerState = portable.optimizer or {"state": {}, "param_groups": []}
    base = cast("torch.optim.Optimizer", zero.optimizer)
    targets = [_state_for(base, flat, optim) for flat in flats]
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        values: dict[str | None, object] = {None: portable.weights[name], **optim["state"].get(name, {})}
        for group, start, (first, numel) in _pieces(zero, param, stage3):
            for key, full in values.items():
                dest = flats[group] if key is None else targets[group].get(key)
                if isinstance(full, torch.Tensor) and dest is not None and dest.dim() > 0:
                    dest.narrow(0, start, numel).copy_(_piece(full, first, numel))
    for flat, target in zip(flats, targets, strict=True):
        base.state[flat] = target
    for group, saved in zip(base.param_groups, optim["param_groups"], strict=False):
        group.update(_hyper(saved))
    if not stage3 and not getattr(zero, "_hp_optimizer_states_linked", True):
        zero._lazy_init_hp_params_optimizer_state()  # map each parameter's state pieces, as after a step


def _piece(full: torch.Tensor, start: int, numel: int) -> torch.Tensor:
    flat = full.detach().flatten()
    if start + numel > flat.numel():  # ZeRO-3 pads a parameter's last partition
        flat = torch.nn.functional.pad(flat, (0, start + numel - flat.numel()))
    return flat.narrow(0, start, numel)


def _pieces(zero: _Zero, param: torch.nn.Parameter, stage3: bool) -> list[tuple[int, int, tuple[int, int]]]:
    """This rank's piece of ``param``: (group, offset in its flat partition, (start, numel) in the param)."""
    if stage3:
        position = zero.grad_position[zero.get_param_id(param)]
        group, offset, numel = (int(v) for v in position)
        rank = dist.get_rank(group=zero.dp_process_group)
        return [(group, offset, (numel * rank, numel))]
    mapping = getattr(param, "_hp_mapping", None)
    if mapping is None:
        return []  # no piece of it on this rank
    group = next(i for i, g in enumerate(zero.bit16_groups) if any(p is param for p in g))
    hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
    return [(group, int(hp.start), (int(lp.start), int(lp.numel)))]


def _state_for(
    base: torch.optim.Optimizer, flat: torch.Tensor, optim: NamedOptimizerState
) -> dict[str, torch.Tensor]:
    """The base optimizer's state of one flat partition, created (zeros) for every saved key if absent."""
    out = cast("dict[str, torch.Tensor]", dict(base.state.get(flat) or {}))
    sample = next(iter(optim["state"].values()), {})
    for key, value in sample.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            out.setdefault(key, torch.zeros_like(flat))
        elif isinstance(value, torch.Tensor):  # per-group scalars (step): the same for every parameter
            out[key] = value.detach().clone().to(out[key].dtype if key in out else value.dtype)
    return out
