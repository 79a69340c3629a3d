"""Checks of a model against the tensor-parallel degree, before anything is split."""

from __future__ import annotations

import torch

__all__ = ["check_heads"]

_HEAD_FIELDS = ("num_attention_heads", "num_key_value_heads")


def _configs(model: torch.nn.Module) -> list[object]:
    config = getattr(model, "config", None)
    if config is None:
        return []
    found = [config]
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        text = get_text()
        if text is not None and text is not config:
            found.append(text)
    return found


def check_heads(model: torch.nn.Module, tp_size: int) -> None:
    """Check that ``tp_size`` divides the attention and key/value head counts the model's config gives.

    Each tensor-parallel rank must hold whole heads: attention reshapes its projections by head.

    Raises:
        ValueError: ``tp_size`` does not divide a head count, naming the field, both numbers and
            the sizes that would work.
    """
    for config in _configs(model):
        for name in _HEAD_FIELDS:
            value = getattr(config, name, None)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                continue
            if value % tp_size:
                fits = [d for d in range(1, value + 1) if value % d == 0]
                raise ValueError(
                    f"tp_size={tp_size} does not divide {type(config).__name__}.{name}={value}: each "
                    f"tensor-parallel rank must hold whole heads; use a tp_size among {fits} (and make "
                    "the other ParallelismConfig sizes take up the remaining processes)"
                )
