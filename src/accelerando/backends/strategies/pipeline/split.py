"""Where to cut a model into pipeline stages: by the user's layer names or by parameter count.

Everything here reads the module tree only (registration order, parameter sizes); nothing runs the
model. The traced pipeline (:mod:`accelerando.backends.strategies.pipeline.stage`) cuts the forward graph at
the *beginning* of each split-point module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

__all__ = [
    "balanced_split_points",
    "generate_stage_map",
    "parameter_units",
    "validate_split_points",
]


def _numel(module: torch.nn.Module, seen: set[int]) -> int:
    total = 0
    for tensor in (*module.parameters(), *module.buffers()):
        if id(tensor) in seen:  # tied weights count once, where they first appear
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    return total


def parameter_units(
    model: torch.nn.Module, no_split_module_classes: Iterable[str] | None = None
) -> list[tuple[str, int]]:
    """The model's indivisible pieces in registration order, with their size in bytes.

    A piece is a module whose class name is in ``no_split_module_classes`` (a transformer block), or
    a module without children. Modules with parameters of their own and children count as one piece,
    so no parameter is left out. When ``no_split_module_classes`` is None, the model's
    ``_no_split_modules`` (transformers models declare it) is used.

    Returns:
        ``[(module name, bytes), ...]``; the root is never a piece of its own unless it has no children.
    """
    classes: Iterable[str] = (
        no_split_module_classes
        if no_split_module_classes is not None
        else (getattr(model, "_no_split_modules", None) or ())
    )
    keep = set(classes)
    seen: set[int] = set()
    units: list[tuple[str, int]] = []

    def walk(prefix: str, module: torch.nn.Module) -> None:
        children = list(module.named_children())
        own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        if prefix and (type(module).__name__ in keep or not children or own):
            units.append((prefix, _numel(module, seen)))
            return
        for name, child in children:
            walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", model)
    return units


def generate_stage_map(
    model: torch.nn.Module,
    num_stages: int,
    no_split_module_classes: Iterable[str] | None = None,
    capacities: Mapping[int, float] | None = None,
) -> dict[str, int]:
    """Assign every piece of :func:`parameter_units` to a stage, contiguously, balancing bytes.

    Args:
        model: the model to split.
        num_stages: how many stages (processes in the pipeline).
        no_split_module_classes: class names never cut through.
        capacities: relative share per stage index (e.g. free memory); equal shares when None.

    Returns:
        ``{module name: stage index}`` in registration order; every stage gets at least one piece.

    Raises:
        ValueError: fewer pieces than stages, or a bad ``num_stages``.
    """
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    units = parameter_units(model, no_split_module_classes)
    if len(units) < num_stages:
        raise ValueError(
            f"the model has {len(units)} indivisible pieces ({[n for n, _ in units]}) but {num_stages} pipeline "
            "stages were asked for; use fewer processes or allow splitting inside those modules "
            "(no_split_module_classes)"
        )
    shares = [float((capacities or {}).get(i, 1.0)) for i in range(num_stages)]
    if any(s <= 0 for s in shares):
        raise ValueError(f"every stage needs a positive capacity, got {shares}")
    total = sum(size for _, size in units) or len(units)
    bounds, acc = [], 0.0
    for share in shares:
        acc += share / sum(shares)
        bounds.append(acc * total)
    stage_map: dict[str, int] = {}
    running, stage = 0.0, 0
    for index, (name, size) in enumerate(units):
        left_units = len(units) - index
        left_stages = num_stages - stage
        # Move on when this stage is full (it already has a piece) or when the rest is needed to give
        # every later stage one piece.
        if stage < num_stages - 1 and stage_map and any(v == stage for v in stage_map.values()):
            midpoint = running + size / 2
            if midpoint > bounds[stage] or left_units < left_stages:
                stage += 1
        stage_map[name] = stage
        running += size if total else 1
    return stage_map


def balanced_split_points(
    model: torch.nn.Module,
    num_stages: int,
    no_split_module_classes: Iterable[str] | None = None,
    capacities: Mapping[int, float] | None = None,
) -> list[str]:
    """The names at which stages 1..n-1 begin when the model is balanced by parameter bytes.

    Raises:
        ValueError: as :func:`generate_stage_map`.
    """
    stage_map = generate_stage_map(model, num_stages, no_split_module_classes, capacities)
    points: list[str] = []
    previous = 0
    for name, stage in stage_map.items():
        if stage != previous:
            points.append(name)
            previous = stage
    return points


def validate_split_points(model: torch.nn.Module, split_points: Sequence[str], num_stages: int) -> list[str]:
    """Check user split points: existing submodules, no duplicates, one fewer than the stages.

    Returns:
        The split points as a list.

    Raises:
        ValueError: an unknown module name (the message lists close names), a duplicate, or a count
            that does not give ``num_stages`` stages.
    """
    points = list(split_points)
    names = dict(model.named_modules())
    for point in points:
        if not isinstance(point, str) or point not in names or point == "":
            close = [n for n in names if n and point and str(point).split(".")[-1] in n][:5]
            raise ValueError(
                f"split point {point!r} is not a submodule of {type(model).__name__}; give module names as in "
                f"model.named_modules(), e.g. {close or list(names)[1:4]}"
            )
    if len(set(points)) != len(points):
        raise ValueError(f"split points repeat a module: {points}")
    if len(points) != num_stages - 1:
        raise ValueError(
            f"{len(points)} split points make {len(points) + 1} pipeline stages but there are {num_stages} "
            f"pipeline processes; give {num_stages - 1} split points or use split_points='auto'"
        )
    return points
