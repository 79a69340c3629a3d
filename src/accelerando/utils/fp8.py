"""FP8 helpers (Transformer Engine / torchao). FP8 needs a CUDA GPU with FP8 support; not implemented yet.

Each function checks for its backend and fails with a message saying what is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers"]


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{what} needs FP8 support (a CUDA GPU of the Hopper generation or newer and transformer-engine), "
        "which accelerando does not implement yet; use mixed_precision='bf16'"
    )


def has_transformer_engine_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` contains Transformer Engine layers (False when the package is absent)."""
    from accelerando.utils.imports import is_transformer_engine_available

    if not is_transformer_engine_available():
        return False
    import transformer_engine.pytorch as te

    return any(isinstance(m, (te.LayerNorm, te.Linear, te.TransformerLayer)) for m in model.modules())


def convert_model(
    model: torch.nn.Module,
    to_transformer_engine: bool = True,
    _convert_linear: bool = True,
    _convert_ln: bool = True,
) -> None:
    """Swap Linear/LayerNorm layers for Transformer Engine ones.

    Raises:
        NotImplementedError: always for now (FP8 is not implemented).
    """
    raise _unsupported("convert_model")


def apply_fp8_autowrap(model: torch.nn.Module, fp8_recipe_handler: Any) -> torch.nn.Module:
    """Wrap ``model.forward`` in FP8 autocast.

    Raises:
        NotImplementedError: always for now (FP8 is not implemented).
    """
    raise _unsupported("apply_fp8_autowrap")


@contextlib.contextmanager
def contextual_fp8_autocast(
    model_forward: Any, fp8_recipe: Any, use_during_eval: bool = False
) -> Iterator[None]:
    """FP8 autocast context.

    Raises:
        NotImplementedError: always for now (FP8 is not implemented).
    """
    raise _unsupported("contextual_fp8_autocast")
    yield  # pragma: no cover
