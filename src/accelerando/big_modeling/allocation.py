"""Building blocks for device-map planning over a list of ``(name, module)`` units.

:func:`accelerando.big_modeling.device_map.infer_auto_device_map` plans in one pass with its own
bookkeeping; these functions expose the same ideas on the reference's data shapes (a list of units
plus the size dict of :func:`~accelerando.big_modeling.sizes.compute_module_sizes`) for callers that
write their own planner, as transformers does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from accelerando.big_modeling.budgets import convert_file_size_to_int
from accelerando.big_modeling.sizes import get_module_leaves

__all__ = [
    "fallback_allocate",
    "get_module_leaves",
    "get_module_size_with_ties",
    "tied_partners",
    "unit_parts",
]

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

# A unit to place: a module, or a tensor (a parameter or buffer) held directly by its parent module.
Unit = tuple[str, "nn.Module | torch.Tensor"]


def _inside(name: str, unit: str) -> bool:
    """Whether tensor or module ``name`` is ``unit`` or lies under it."""
    return not unit or name == unit or name.startswith(f"{unit}.")


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int | float,
    module_sizes: Mapping[str, int | float],
    modules_to_treat: list[Unit],
) -> tuple[int | float, list[str], list[nn.Module | torch.Tensor]]:
    """Size of a unit together with the units holding the other names of its tied parameters.

    Tied parameters must share a device, so placing a unit means placing the (not yet placed) units
    that hold its tied partners too. For each name in ``tied_params``, the first unit of
    ``modules_to_treat`` containing it is a partner; the partner's size is added minus the tied
    tensor's own size (its storage is the one already counted in the unit). As in the reference, a
    partner holding two of the names is listed, and counted, once per name.

    Args:
        tied_params: names of the tied partners outside the unit.
        module_size: the unit's own size in bytes.
        module_sizes: name -> bytes for modules and tensors.
        modules_to_treat: the units not placed yet; partners are looked up among them.

    Returns:
        ``(total bytes, partner unit names, partner units)``; a name no unit of ``modules_to_treat``
        holds (already placed) adds nothing.
    """
    total = module_size
    names: list[str] = []
    modules: list[nn.Module | torch.Tensor] = []
    for param in tied_params:
        owner = next(((n, m) for n, m in modules_to_treat if _inside(param, n) and n), None)
        if owner is None:
            continue
        names.append(owner[0])
        modules.append(owner[1])
        total += module_sizes.get(owner[0], 0) - module_sizes.get(param, 0)
    return total, names, modules


def unit_parts(module: object, name: str) -> list[Unit]:
    """What a unit splits into: a module's own parameters, then its children, with full names.

    A module's own buffers are not parts (the reference splits this way). A tensor has no parts.

    Args:
        module: the unit (a module or a tensor).
        name: its full name.

    Returns:
        ``(full name, part)`` pairs; empty for a tensor or a module without children.
    """
    if not isinstance(module, nn.Module):
        return []
    children = list(module.named_children())
    if not children:
        return []
    prefix = f"{name}." if name else ""
    own: list[Unit] = [(prefix + n, p) for n, p in module.named_parameters(recurse=False)]
    return own + [(prefix + n, c) for n, c in children]


def tied_partners(name: str, tied_parameters: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """The tied groups that cross the boundary of unit ``name``, and their names outside it.

    A name counts as inside the unit when ``name + "."`` occurs in ``tied + "."`` (the reference's
    test, which also matches a unit name appearing deeper in a tensor's path).

    Args:
        name: the unit's full name.
        tied_parameters: groups of tied parameter names.

    Returns:
        ``(groups, outside names)``.
    """
    marker = f"{name}."
    groups = [
        group
        for group in tied_parameters
        if any(marker in f"{k}." for k in group) and not all(marker in f"{k}." for k in group)
    ]
    outside = [p for group in groups for p in group if marker not in f"{p}."]
    return groups, outside


def fallback_allocate(
    modules: list[Unit],
    module_sizes: Mapping[str, int | float],
    size_limit: int | str,
    no_split_module_classes: list[str] | None = None,
    tied_parameters: list[list[str]] | None = None,
) -> tuple[str | None, nn.Module | torch.Tensor | None, list[Unit]]:
    """Find the first unit, in order, that fits in ``size_limit`` bytes (with its tied partners).

    Units are searched depth first: a unit too large is replaced by its direct parameters and
    children (unless its class is in ``no_split_module_classes``). The found unit is taken out of
    ``modules``; the parents it was found inside are replaced there by their parts, so the returned
    list still covers everything else exactly once.

    Args:
        modules: the units left to place, in order.
        module_sizes: name -> bytes for modules and tensors.
        size_limit: free bytes on the device (an int or a size string like ``"2GB"``).
        no_split_module_classes: class names never split.
        tied_parameters: groups of tied parameter names.

    Returns:
        ``(name, unit, remaining units)``, or ``(None, None, modules)`` when nothing fits (or the
        limit is not a readable size).
    """
    try:
        limit = convert_file_size_to_int(size_limit)
    except (ValueError, TypeError):
        return None, None, modules
    no_split = set(no_split_module_classes or ())
    tied = tied_parameters or []
    search = list(modules)
    found: Unit | None = None
    while search:
        name, module = search.pop(0)
        _, outside = tied_partners(name, tied)
        size, _, _ = get_module_size_with_ties(outside, module_sizes.get(name, 0), module_sizes, search)
        if size <= limit:
            found = (name, module)
            break
        if type(module).__name__ not in no_split:
            search = unit_parts(module, name) + search
    if found is None:
        return None, None, modules
    target = found[0]
    remaining = list(modules)
    # Open every ancestor of the target that is a unit of the list, outermost first.
    for end in [i for i, char in enumerate(target) if char == "."]:
        parent_name = target[:end]
        position = next((i for i, (n, _) in enumerate(remaining) if n == parent_name), None)
        if position is not None:
            # An ancestor of the target is a module with children, so its parts are never empty.
            remaining[position : position + 1] = unit_parts(remaining[position][1], parent_name)
    position = next(i for i, (n, _) in enumerate(remaining) if n == target)
    name, module = remaining.pop(position)
    return name, module, remaining
