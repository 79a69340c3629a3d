"""FP8 on CUDA GPUs: Transformer Engine (layer swap + FP8 autocast) and MS-AMP (``msamp.initialize``).

Both are built only after :func:`accelerando.precision.fp8.fp8_backend_problem` found a CUDA device
and the package, so nothing here runs on a CPU-only machine.
"""

from __future__ import annotations

from typing import Any

import torch

from accelerando.precision.fp8_base import FP8Precision

__all__ = ["MSAMPPrecision", "TEPrecision", "msamp_deepspeed_config"]


class TEPrecision(FP8Precision):
    """Transformer Engine FP8: Linear/LayerNorm become TE layers and the forward runs in FP8 autocast.

    Args:
        device_type: "cuda".
        recipe: a ``TERecipeKwargs`` (or the deprecated ``FP8RecipeKwargs``).
    """

    backend_name = "te"

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swap layers for TE ones (unless the model has some already) and wrap the forward in FP8 autocast.

        Raises:
            ImportError: Transformer Engine is not installed.
        """
        from accelerando.utils.transformer_engine import (
            apply_fp8_autowrap,
            convert_model,
            has_transformer_engine_layers,
        )

        recipe = self.resolve_recipe()
        if not has_transformer_engine_layers(model):
            with torch.no_grad():
                convert_model(model)
        return apply_fp8_autowrap(model, recipe)


class MSAMPPrecision(FP8Precision):
    """MS-AMP FP8: ``msamp.initialize(model, optimizer, opt_level)`` turns weights, gradients and (O2)
    optimizer states into FP8.

    MS-AMP converts a model together with its optimizer: :meth:`initialize` does it for one pair;
    under DeepSpeed the engine does it from :func:`msamp_deepspeed_config`.

    Args:
        device_type: "cuda".
        recipe: an ``MSAMPRecipeKwargs`` (or ``FP8RecipeKwargs(backend="MSAMP")``).
    """

    backend_name = "msamp"

    def initialize(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
        """Convert ``model`` and ``optimizer`` with MS-AMP at the recipe's ``opt_level``.

        Raises:
            ImportError: MS-AMP is not installed.
        """
        from accelerando.utils.imports import is_msamp_available

        if not is_msamp_available():
            raise ImportError(
                "fp8_backend='msamp' needs MS-AMP (github.com/Azure/MS-AMP); or use fp8_backend='ao'"
            )
        import msamp

        return msamp.initialize(model, optimizer, opt_level=self.resolve_recipe().opt_level)


def msamp_deepspeed_config(config: dict[str, Any], opt_level: str = "O2") -> dict[str, Any]:
    """A DeepSpeed config with MS-AMP enabled (the ``"msamp"`` block that ``msamp.deepspeed`` reads).

    Args:
        config: the DeepSpeed config (not modified).
        opt_level: "O1" or "O2".

    Returns:
        A copy with ``{"msamp": {"enabled": True, "opt_level": opt_level}}``.

    Raises:
        ValueError: ``opt_level`` is not "O1"/"O2".
    """
    if opt_level not in ("O1", "O2"):
        raise ValueError(f"msamp opt_level must be 'O1' or 'O2', got {opt_level!r}")
    return {**config, "msamp": {"enabled": True, "opt_level": opt_level}}
