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
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from accelerando.backends.strategies.conversion import CheckpointConversionError, PortableState
from accelerando.checkpointing import files as F

__all__ = ["apply_deepspeed", "read_deepspeed", "trainable_names"]

# Types DeepSpeed's checkpoint files hold; rebuilding them runs no code of the file's choosing.
_SAFE = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def _load(path: str) -> Any:
    safe = []
    for module, name in _SAFE:
        with contextlib.suppress(ImportError, AttributeError):
            safe.append(getattr(importlib.import_module(module), name))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"DeepSpeed checkpoint file {path!r} is missing; was the folder copied whole?"
        )
    with torch.serialization.safe_globals(safe):
        return F.torch_load(path, "cpu")


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


def _ranks(tag: str, world: int) -> list[dict[str, Any]]:
    return [
        _load(os.path.join(tag, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))["optimizer_state_dict"]
        for r in range(world)
    ]


def _read_zero12(tag: str, world: int) -> PortableState:
    model = _load(os.path.join(tag, "mp_rank_00_model_states.pt"))
    ranks = _ranks(tag, world)
    weights = {k: v for k, v in model["module"].items()}
    state: dict[str, dict[str, torch.Tensor]] = {}
    groups = []
    for g, shapes in enumerate(model["param_shapes"]):
        flats = [r["single_partition_of_fp32_groups"][g] for r in ranks]
        base = [r["base_optimizer_state"]["state"].get(g, {}) for r in ranks]
        # Per-element state (exp_avg...): flat like the partition (which a save may store unpadded).
        keys = [k for k, v in base[0].items() if isinstance(v, torch.Tensor) and v.dim() == 1]
        for name, shape in shapes.items():
            pieces = [(r, ranks[r]["param_slice_mappings"][g].get(name)) for r in range(world)]
            pieces = [(r, a) for r, a in pieces if a is not None]
            weights[name] = _join([flats[r].narrow(0, a.start, a.numel) for r, a in pieces], shape, name)
            entry = {
                k: _join([base[r][k].narrow(0, a.start, a.numel) for r, a in pieces], shape, name)
                for k in keys
            }
            entry.update({k: v.clone() for k, v in base[0].items() if k not in keys})  # e.g. step
            state[name] = entry
        groups.append({**_hyper(ranks[0]["base_optimizer_state"]["param_groups"][g]), "params": list(shapes)})
    return PortableState(weights, {"state": state, "param_groups": groups})


def _read_zero3(tag: str, world: int) -> PortableState:
    model = _load(os.path.join(tag, "zero_pp_rank_0_mp_rank_00_model_states.pt"))
    if model.get("frozen_param_shapes"):
        raise CheckpointConversionError(
            f"{tag!r}: a ZeRO-3 checkpoint with frozen parameters is not converted; load it under "
            "DeepSpeed ZeRO-3 on the same number of processes."
        )
    ranks = _ranks(tag, world)
    buffers = set(model.get("buffer_names") or [])
    weights = {k: v for k, v in model["module"].items() if k in buffers}
    base = [r["optimizer_state_dict"]["state"] for r in ranks]
    flats = [torch.cat(list(r["fp32_flat_groups"])) for r in ranks]
    keys = [k for k, v in base[0].get(0, {}).items() if isinstance(v, torch.Tensor) and v.dim() == 1]
    # Each sub-group's state cut to its saved partition (a state may be padded beyond it).
    states = {
        k: [
            torch.cat([b[g][k][: f.numel()] for g, f in enumerate(r["fp32_flat_groups"])])
            for b, r in zip(base, ranks, strict=True)
        ]
        for k in keys
    }
    hyper = [_hyper(g) for g in ranks[0]["optimizer_state_dict"]["param_groups"]]
    if any(h != hyper[0] for h in hyper):
        raise CheckpointConversionError(
            f"{tag!r}: a ZeRO-3 checkpoint with several parameter groups is not converted; load it under "
            "DeepSpeed ZeRO-3 on the same number of processes."
        )
    scalars = {k: v.clone() for k, v in base[0].get(0, {}).items() if k not in keys}
    state: dict[str, dict[str, torch.Tensor]] = {}
    offset, names = 0, []
    for shapes in model["param_shapes"]:
        for name, shape in shapes.items():
            part = math.ceil(math.prod(shape) / world)
            weights[name] = _join([f.narrow(0, offset, part) for f in flats], shape, name, pad=True)
            state[name] = {
                k: _join([s.narrow(0, offset, part) for s in v], shape, name, pad=True)
                for k, v in states.items()
            }
            state[name].update({k: v.clone() for k, v in scalars.items()})
            offset += part
            names.append(name)
    if offset != flats[0].numel():
        raise CheckpointConversionError(
            f"{tag!r}: the ZeRO-3 partitions hold {flats[0].numel()} elements, the shapes {offset}"
        )
    return PortableState(weights, {"state": state, "param_groups": [{**hyper[0], "params": names}]})


def _join(pieces: list[torch.Tensor], shape: Any, name: str, pad: bool = False) -> torch.Tensor:
    full = torch.cat(pieces) if pieces else torch.empty(0)
    numel = math.prod(shape)
    if full.numel() < numel or (full.numel() != numel and not pad):
        raise CheckpointConversionError(
            f"DeepSpeed pieces of {name!r} hold {full.numel()} elements, its shape {tuple(shape)} needs {numel}"
        )
    return full[:numel].clone().view(tuple(shape))


def _hyper(group: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def trainable_names(engine: Any) -> dict[int, str]:
    """``id(parameter) -> name`` for the engine's module."""
    return {id(p): n for n, p in engine.module.named_parameters()}


@torch.no_grad()
def apply_deepspeed(engine: Any, portable: PortableState, load_weights: Any) -> None:
    """Write ``portable`` into ``engine``: module weights, fp32 master pieces, base optimizer state.

    Args:
        engine: A ``DeepSpeedEngine`` built with its optimizer (any ZeRO stage, any process count).
        portable: What to load (full tensors by name).
        load_weights: ``(engine, state_dict) -> None``, loading the module's weights (gathered under ZeRO-3).
    """
    load_weights(engine, portable.weights)
    zero = engine.optimizer
    names = trainable_names(engine)
    stage3 = hasattr(zero, "fp32_partitioned_groups_flat")
    flats = zero.fp32_partitioned_groups_flat if stage3 else zero.single_partition_of_fp32_groups
    optim = portable.optimizer or {"state": {}, "param_groups": []}
    base = zero.optimizer
    targets = [_state_for(base, flat, optim) for flat in flats]
    group_of = {} if stage3 else {id(p): i for i, g in enumerate(zero.bit16_groups) for p in g}
    for param in engine.module.parameters():
        if not param.requires_grad:
            continue
        name = names[id(param)]
        values = {None: portable.weights[name], **optim["state"].get(name, {})}
        for group, start, source in _pieces(zero, param, stage3, group_of):
            for key, full in values.items():
                if key is None or (key in targets[group] and targets[group][key].dim() > 0):
                    dest = flats[group] if key is None else targets[group][key]
                    dest.narrow(0, start, source[1]).copy_(_piece(full, source[0], source[1]))
    for flat, target in zip(flats, targets, strict=True):
        base.state[flat] = target
    for group, saved in zip(base.param_groups, optim["param_groups"], strict=False):
        group.update({k: v for k, v in saved.items() if k != "params"})
    if not stage3 and not getattr(zero, "_hp_optimizer_states_linked", True):
        zero._lazy_init_hp_params_optimizer_state()


def _piece(full: torch.Tensor, start: int, numel: int) -> torch.Tensor:
    flat = full.detach().flatten()
    if start + numel > flat.numel():  # ZeRO-3 pads a parameter's last partition
        flat = torch.nn.functional.pad(flat, (0, start + numel - flat.numel()))
    return flat.narrow(0, start, numel)


def _pieces(
    zero: Any, param: Any, stage3: bool, group_of: dict[int, int]
) -> list[tuple[int, int, tuple[int, int]]]:
    """This rank's piece of ``param``: (group, offset in its flat partition, (start, numel) in the param)."""
    if stage3:
        group, offset, numel = zero.grad_position[zero.get_param_id(param)]
        rank = dist.get_rank(group=zero.dp_process_group)
        return [(int(group), int(offset), (int(numel) * rank, int(numel)))]
    mapping = getattr(param, "_hp_mapping", None)
    if mapping is None:
        return []
    hp, lp = mapping.hp_fragment_address, mapping.lp_fragment_address
    return [(group_of[id(param)], int(hp.start), (int(lp.start), int(lp.numel)))]


def _state_for(base: Any, flat: torch.Tensor, optim: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The base optimizer's state of one flat partition, created (zeros) for every saved key if absent."""
    out: dict[str, torch.Tensor] = dict(base.state.get(flat) or {})
    sample = next(iter(optim["state"].values()), {})
    for key, value in sample.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            out.setdefault(key, torch.zeros_like(flat))
        elif isinstance(value, torch.Tensor):  # per-group scalars (step): the same for every parameter
            out[key] = value.detach().clone().to(out[key].dtype if key in out else value.dtype)
    return out
