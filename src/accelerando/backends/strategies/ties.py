"""Tied parameters (one tensor used by several modules) through tensor parallelism and FSDP2.

A tied model (e.g. ``tie_word_embeddings=True``: ``lm_head.weight`` IS ``embed_tokens.weight``)
registers one ``Parameter`` under several names. torch's ``parallelize_module`` splits each
planned module's parameters into a new ``Parameter`` of its own, so after it the names no longer
share one tensor. As transformers does after its own tensor-parallel loading, the tie is restored
by pointing every name of a group at one split parameter; that is exact only when every module of
the group split the shared tensor the same way (same mesh and placements), which is checked.

With FSDP2 on top, a tied parameter must live in one sharded unit: a unit holding only some of its
modules would free the shared weight while another module still needs it, so such units are left
to the enclosing one (transformers' FSDP plan rewrite for tied embeddings does the same).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import torch

__all__ = [
    "check_ties",
    "fill_tied_entries",
    "find_ties",
    "retie",
    "share_tied_entries",
    "units_keeping_ties",
]

_V = TypeVar("_V")


def find_ties(model: torch.nn.Module) -> list[list[str]]:
    """The groups of names under which one ``Parameter`` object is registered, in module order.

    Each group has two or more names; the first is the one ``named_parameters()`` reports (and
    the one an optimizer built over ``model.parameters()`` holds).
    """
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _owner(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    module_name, _, attr = name.rpartition(".")
    return (model.get_submodule(module_name) if module_name else model), attr


def _layout(tensor: torch.Tensor) -> str:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return f"DTensor{tuple(tensor.placements)} on mesh {tensor.device_mesh.mesh_dim_names}"
    return "a whole (unsplit) tensor"


def _same_split(a: torch.Tensor, b: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    if not (isinstance(a, DTensor) and isinstance(b, DTensor)):
        return False
    return (
        a.device_mesh == b.device_mesh
        and tuple(a.placements) == tuple(b.placements)
        and a.shape == b.shape
        and a.dtype == b.dtype
    )


def _style_of(name: str, styles: Mapping[str, object]) -> str:
    module_name = name.rpartition(".")[0]
    style = styles.get(module_name)
    if style is None:
        return "not in the plan"
    return repr(style) if isinstance(style, str) else type(style).__name__


def check_ties(
    model: torch.nn.Module, ties: Sequence[Sequence[str]], styles: Mapping[str, object] | None = None
) -> list[list[str]]:
    """Check that each tie group's names still split the shared tensor alike; return the groups to re-tie.

    Call after the tensor-parallel plan was applied, with :func:`find_ties` taken before it.

    Args:
        model: the model the plan was applied to.
        ties: the tie groups found before the plan was applied.
        styles: module name -> the plan's style for it (only used to name them in the error).

    Returns:
        The groups whose names now hold different (equally split) parameters.

    Raises:
        ValueError: the names of a group now hold tensors split differently (or one split and one
            whole), naming every parameter, its layout and plan entry, and the ways to fix it.
    """
    broken: list[list[str]] = []
    for group in ties:
        params = [getattr(*_owner(model, name)) for name in group]
        if all(p is params[0] for p in params):
            continue
        if all(_same_split(params[0], p) for p in params[1:]):
            broken.append(list(group))
            continue
        described = "; ".join(
            f"{name}: {_layout(p)} (plan: {_style_of(name, styles or {})})"
            for name, p in zip(group, params, strict=True)
        )
        raise ValueError(
            f"the tensor-parallel plan splits the tied parameters {', '.join(group)} (one shared tensor) in "
            f"different ways: {described}. A tied tensor can only be split one way: give their modules styles "
            "that split the shared weight alike (for tied embeddings: 'embedding_rowwise' on the embedding with "
            "'colwise' / 'colwise_rep' on the output head, which both split the vocabulary), leave all of them "
            "out of the plan, or untie them before prepare (e.g. config tie_word_embeddings=False)"
        )
    return broken


def retie(model: torch.nn.Module, groups: Sequence[Sequence[str]]) -> None:
    """Point every name of each group at the parameter registered under the group's first name."""
    for group in groups:
        shared = getattr(*_owner(model, group[0]))
        for name in group[1:]:
            module, attr = _owner(model, name)
            module.register_parameter(attr, shared)


def units_keeping_ties(
    model: torch.nn.Module, units: Sequence[torch.nn.Module]
) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
    """Split FSDP unit candidates into (kept, dropped): a unit is dropped when it holds some, not all,
    of the modules sharing a tied parameter (the enclosing unit then shards that parameter).
    """
    owners: list[set[int]] = []
    for group in find_ties(model):
        owners.append({id(_owner(model, name)[0]) for name in group})
    if not owners:
        return list(units), []
    kept: list[torch.nn.Module] = []
    dropped: list[torch.nn.Module] = []
    for unit in units:
        inside = {id(m) for m in unit.modules()}
        splits = any(0 < len(group & inside) < len(group) for group in owners)
        (dropped if splits else kept).append(unit)
    return kept, dropped


def share_tied_entries(state_dict: dict[str, _V], ties: Sequence[Sequence[str]]) -> dict[str, _V]:
    """Make the entries of each tie group one tensor again (the first name's); returns ``state_dict``.

    A gathered state dict holds a separate full copy per name of a tied parameter; sharing one
    tensor again lets writers store it once (as for a plain tied model) and halves the memory.
    Names absent from ``state_dict`` (e.g. ``{}`` on processes other than the main one) are skipped.
    """
    for group in ties:
        present = [name for name in group if name in state_dict]
        for name in present[1:]:
            state_dict[name] = state_dict[present[0]]
    return state_dict


def fill_tied_entries(state_dict: Mapping[str, _V], ties: Sequence[Sequence[str]]) -> dict[str, _V]:
    """A copy of ``state_dict`` where the names of a tie group it lacks take the value of one it has.

    Weights files store a tied tensor once (e.g. ``model.embed_tokens.weight`` without
    ``lm_head.weight``); a strict load into a model whose state dict lists every name needs the rest.
    """
    filled = dict(state_dict)
    for group in ties:
        present = [name for name in group if name in filled]
        if present:
            for name in group:
                filled.setdefault(name, filled[present[0]])
    return filled
