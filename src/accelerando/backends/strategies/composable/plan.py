"""Tensor-parallel plans: which submodule is split how, and the torch ``ParallelStyle`` for each.

A plan maps module names (``*`` standing for one name component, e.g. a layer number) to a style.
Styles are either torch ``ParallelStyle`` objects or the strings transformers models declare in
``tp_plan`` / ``base_model_tp_plan``; the strings this module understands are:

- ``colwise``: the weight's output features are split; the output stays split (the next
  ``rowwise`` layer consumes it).
- ``rowwise``: the weight's input features are split; the partial outputs are summed.
- ``colwise_rep`` / ``colwise_gather_output``: ``colwise`` whose output is gathered whole.
- ``rowwise_rep`` / ``embedding_rowwise``: ``rowwise`` fed a whole (replicated) input; on an
  ``nn.Embedding`` the vocabulary rows are split.
- ``local_colwise`` / ``local_rowwise``: the same splits (the local results are what torch returns).
- ``replicate`` / ``gather``: left whole on every rank.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

__all__ = ["STYLE_NAMES", "module_plan", "resolve_plan", "to_parallel_style"]

# String styles understood here, each to (kind, replicated input, replicated output).
_STRING_STYLES: dict[str, tuple[str | None, bool, bool]] = {
    "colwise": ("colwise", False, False),
    "local_colwise": ("colwise", False, False),
    "colwise_rep": ("colwise", False, True),
    "colwise_gather_output": ("colwise", False, True),
    "rowwise": ("rowwise", False, False),
    "local_rowwise": ("rowwise", False, False),
    "rowwise_rep": ("rowwise", True, False),
    "embedding_rowwise": ("rowwise", True, False),
    "replicate": (None, False, False),
    "gather": (None, False, False),
}
STYLE_NAMES: tuple[str, ...] = tuple(_STRING_STYLES)


def module_plan(model: torch.nn.Module) -> dict[str, object]:
    """The tensor-parallel plan a model declares, with names relative to ``model``; ``{}`` when none.

    Transformers models expose the whole plan (the base model's ``base_model_tp_plan`` under its
    prefix plus the heads' ``_tp_plan``) as ``model.tp_plan``; older versions only have the parts,
    which are combined here the same way.
    """
    whole = getattr(model, "tp_plan", None)
    if isinstance(whole, Mapping) and whole:
        return dict(whole)
    plan: dict[str, object] = {}
    own = getattr(model, "_tp_plan", None)
    if isinstance(own, Mapping):
        plan.update(own)
    base_prefix = getattr(model, "base_model_prefix", "") or ""
    base = getattr(model, base_prefix, None) if base_prefix else None
    owner, prefix = (base, f"{base_prefix}.") if isinstance(base, torch.nn.Module) else (model, "")
    base_plan = getattr(getattr(owner, "config", None), "base_model_tp_plan", None)
    if isinstance(base_plan, Mapping):
        plan.update({f"{prefix}{key}": style for key, style in base_plan.items()})
    return plan


def _pattern(key: str) -> re.Pattern[str]:
    parts = [r"[^.]+" if part == "*" else re.escape(part) for part in key.split(".")]
    return re.compile(r"\.".join(parts))


def resolve_plan(model: torch.nn.Module, plan: Mapping[str, object]) -> dict[str, object]:
    """Expand a plan's wildcards into the concrete submodule names of ``model``, in module order.

    Args:
        model: the model the plan is applied to.
        plan: name pattern -> style (a ``ParallelStyle`` or one of :data:`STYLE_NAMES`).

    Returns:
        module name -> style, one entry per matched submodule (a later, more specific key wins).

    Raises:
        ValueError: no key of the plan matches any submodule (the plan is for another model).
    """
    patterns = [(_pattern(key), key, style) for key, style in plan.items()]
    resolved: dict[str, object] = {}
    matched: set[str] = set()
    for name, _ in model.named_modules():
        if not name:
            continue
        for pattern, key, style in patterns:
            if pattern.fullmatch(name):
                resolved[name] = style
                matched.add(key)
    if plan and not matched:
        sample = [name for name, _ in model.named_modules() if name][:5]
        raise ValueError(
            f"no key of the tensor-parallel plan ({sorted(plan)[:5]}...) names a submodule of "
            f"{type(model).__name__} (whose submodules are e.g. {sample}); give a plan written for this model"
        )
    return resolved


def to_parallel_style(style: object, module: torch.nn.Module, name: str) -> ParallelStyle | None:
    """The torch ``ParallelStyle`` for one plan entry; None for a module left whole.

    Raises:
        ValueError: an unknown style name, or a split style on a module that is neither
            ``nn.Linear`` nor ``nn.Embedding`` (torch's column/row styles split only those).
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    if isinstance(style, ParallelStyle):
        return style
    if not isinstance(style, str) or style not in _STRING_STYLES:
        raise ValueError(
            f"tensor-parallel plan entry {name!r}: unknown style {style!r}; use one of {list(STYLE_NAMES)} "
            "or a torch.distributed.tensor.parallel ParallelStyle"
        )
    kind, replicated_input, replicated_output = _STRING_STYLES[style]
    if kind is None:
        return None
    if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        raise ValueError(
            f"tensor-parallel plan entry {name!r} asks for {style!r} on a {type(module).__name__}; the "
            "string styles split nn.Linear / nn.Embedding layers only: give a ParallelStyle for it instead"
        )
    if kind == "colwise":
        return ColwiseParallel(output_layouts=Replicate()) if replicated_output else ColwiseParallel()
    return RowwiseParallel(input_layouts=Replicate()) if replicated_input else RowwiseParallel()
