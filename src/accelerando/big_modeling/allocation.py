"""Building blocks for device-map planning over a list of ``(name, module)`` units.

:func:`accelerando.big_modeling.device_map.infer_auto_device_map` plans in one pass with its own
bookkeeping; these functions expose the same ideas on the reference's data shapes (a list of units
plus the size dict of :func:`~accelerando.big_modeling.sizes.compute_module_sizes`) for callers that
write their own planner, as transformers does.
"""

from __future__ import annotations

from torch import nn

from accelerando.big_modeling.budgets import convert_file_size_to_int

__all__ = ["fallback_allocate", "get_module_leaves", "get_module_size_with_ties"]

Unit = tuple[str, nn.Module]


def _inside(name: str, unit: str) -> bool:
    """Whether tensor or module ``name`` is ``unit`` or lies under it."""
    return not unit or name == unit or name.startswith(f"{unit}.")


def get_module_leaves(module_sizes: dict[str, int]) -> list[str]:
    """Names in a size dict that have nothing under them (tensors, and modules without tensors).

    Args:
        module_sizes: name -> bytes, as returned by ``compute_module_sizes`` (``""`` is the model).

    Returns:
        The leaf names, in the dict's order (``""`` is never a leaf).
    """
    parents = {name.rpartition(".")[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: dict[str, int],
    modules_to_treat: list[Unit],
) -> tuple[int, list[str], list[nn.Module]]:
    """Size of a unit together with the units holding the other names of its tied parameters.

    Tied parameters must share a device, so placing a unit means placing the (not yet placed) units
    that hold its tied partners too. Each partner unit counts once, without the tied tensors themselves
    (their storage is the one already counted in the unit).

    Args:
        tied_params: names of the tied partners outside the unit.
        module_size: the unit's own size in bytes.
        module_sizes: name -> bytes for modules and tensors.
        modules_to_treat: the units not placed yet; partners are looked up among them.

    Returns:
        ``(total bytes, partner unit names, partner units)``; partners not among ``modules_to_treat``
        (already placed) add nothing.
    """
    total = module_size
    names: list[str] = []
    modules: list[nn.Module] = []
    shared: dict[str, int] = {}
    for param in tied_params:
        owner = next(((n, m) for n, m in modules_to_treat if _inside(param, n)), None)
        if owner is None:
            continue
        if owner[0] not in shared:
            names.append(owner[0])
            modules.append(owner[1])
            shared[owner[0]] = 0
        shared[owner[0]] += module_sizes.get(param, 0)
    for name in names:
        total += module_sizes.get(name, 0) - shared[name]
    return total, names, modules


def _parts(module: nn.Module, name: str) -> list[tuple[str, object]]:
    """A module's direct parameters then its children, with full names."""
    prefix = f"{name}." if name else ""
    return [(prefix + n, p) for n, p in module.named_parameters(recurse=False)] + [
        (prefix + n, c) for n, c in module.named_children()
    ]


def _partners(name: str, tied_parameters: list[list[str]]) -> list[str]:
    """Names tied to something inside ``name`` but lying outside it."""
    outside: list[str] = []
    for group in tied_parameters:
        inside = [_inside(p, name) for p in group]
        if any(inside) and not all(inside):
            outside.extend(p for p, is_in in zip(group, inside, strict=True) if not is_in)
    return outside


def fallback_allocate(
    modules: list[Unit],
    module_sizes: dict[str, int],
    size_limit: int | str,
    no_split_module_classes: list[str] | None = None,
    tied_parameters: list[list[str]] | None = None,
) -> tuple[str | None, nn.Module | None, list[Unit]]:
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
    except ValueError:
        return None, None, modules
    no_split = set(no_split_module_classes or ())
    tied = tied_parameters or []
    search = list(modules)
    found: Unit | None = None
    while search:
        name, module = search.pop(0)
        size, _, _ = get_module_size_with_ties(
            _partners(name, tied), module_sizes.get(name, 0), module_sizes, search
        )
        if size <= limit:
            found = (name, module)
            break
        if isinstance(module, nn.Module) and type(module).__name__ not in no_split:
            search = _parts(module, name) + search
    if found is None:
        return None, None, modules
    target = found[0]
    remaining = list(modules)
    # Open every ancestor of the target that is a unit of the list, outermost first.
    while not any(n == target for n, _ in remaining):
        position = next(i for i, (n, _) in enumerate(remaining) if _inside(target, n))
        parent_name, parent = remaining[position]
        remaining[position : position + 1] = _parts(parent, parent_name)
    position = next(i for i, (n, _) in enumerate(remaining) if n == target)
    name, module = remaining.pop(position)
    return name, module, remaining
