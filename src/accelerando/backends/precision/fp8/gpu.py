"""FP8 on CUDA GPUs: Transformer Engine (layer swap + FP8 autocast) and MS-AMP (``msamp.initialize``).

Both are built only after :func:`accelerando.backends.precision.fp8.fp8_backend_problem` found a CUDA device
and the package, so nothing here runs on a CPU-only machine.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence

import torch

import accelerando.core.runtime as rt
from accelerando.backends.precision.fp8.base import FP8Precision
from accelerando.backends.precision.fp8.transformer_engine import (
    apply_fp8_autowrap,
    convert_model,
    has_transformer_engine_layers,
)
from accelerando.common.imports import is_msamp_available

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
        recipe = self.resolve_recipe()
        if not has_transformer_engine_layers(model):
            with torch.no_grad():
                convert_model(model)
        return apply_fp8_autowrap(model, recipe)


class MSAMPPrecision(FP8Precision):
    """MS-AMP FP8: ``msamp.initialize(model, optimizer, opt_level)`` turns weights, gradients and (O2)
    optimizer states into FP8.

    MS-AMP converts a model together with its optimizer, so the conversion happens in
    :meth:`prepare_objects` (one ``prepare`` call holding exactly one model and its optimizer), before
    any wrapping (DDP); ``convert_module`` only checks it happened. Under DeepSpeed the engine does it
    from the ``"msamp"`` block of its config (:func:`msamp_deepspeed_config`) and none of this runs.

    Args:
        device_type: "cuda".
        recipe: an ``MSAMPRecipeKwargs`` (or ``FP8RecipeKwargs(backend="MSAMP")``).
    """

    backend_name = "msamp"

    def __init__(self, device_type: str, recipe: object) -> None:
        super().__init__(device_type, recipe)
        self._converted: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    def initialize(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Convert ``model`` and ``optimizer`` with MS-AMP at the recipe's ``opt_level``.

        Raises:
            ImportError: MS-AMP is not installed.
        """
        if not is_msamp_available():
            raise ImportError(
                "fp8_backend='msamp' needs MS-AMP (github.com/Azure/MS-AMP); or use fp8_backend='ao'"
            )
        import msamp

        model, optimizer = msamp.initialize(model, optimizer, opt_level=self.resolve_recipe().opt_level)
        self._converted.add(model)
        return model, optimizer

    def prepare_objects(
        self,
        objects: Sequence[object],
        placement: Sequence[bool],
        device: torch.device | None,
        is_prepared: Callable[[object], bool],
    ) -> list[object]:
        """Run MS-AMP on the model and optimizer of one ``prepare`` call, before any wrapping.

        The model is moved to ``device`` first (when its placement is on): MS-AMP builds its FP8
        weights where the parameters are. Calls holding no new model or optimizer (dataloaders only)
        pass through.

        Args:
            objects: the objects of the ``prepare`` call, in the caller's order.
            placement: per object, whether it is moved to the device.
            device: the training device.
            is_prepared: whether an object was prepared by an earlier call (left alone).

        Returns:
            The objects with the model and optimizer replaced by MS-AMP's.

        Raises:
            ValueError: not exactly one model and one optimizer among the new objects, or an FSDP run.
            ImportError: MS-AMP is not installed.
        """
        result = list(objects)
        models = [i for i, o in enumerate(objects) if isinstance(o, torch.nn.Module) and not is_prepared(o)]
        optimizers = [
            i
            for i, o in enumerate(objects)
            if isinstance(o, torch.optim.Optimizer)
            and not is_prepared(o)
            and not hasattr(o, "optimizer")  # already an AcceleratedOptimizer
        ]
        if not models and not optimizers:
            return result
        if len(models) != 1 or len(optimizers) != 1:
            raise ValueError(
                f"MS-AMP converts one model together with its optimizer, but this prepare() call got "
                f"{len(models)} model(s) and {len(optimizers)} optimizer(s): pass exactly one model and its "
                "optimizer to accelerator.prepare(model, optimizer, ...); for several models use "
                "fp8_backend='te' or 'ao'"
            )
        _refuse_fsdp()
        (m,), (o,) = models, optimizers
        model, optimizer = result[m], result[o]
        # The indices were picked above by these very isinstance tests.
        assert isinstance(model, torch.nn.Module)
        assert isinstance(optimizer, torch.optim.Optimizer)
        if device is not None and placement[m]:
            model.to(device)  # in place: the optimizer keeps the same Parameter objects
        result[m], result[o] = self.initialize(model, optimizer)
        return result

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Check that MS-AMP converted ``model`` (in :meth:`prepare_objects`); nothing else to do.

        Raises:
            ValueError: the model came without its optimizer (e.g. ``prepare_model`` alone).
        """
        if model not in self._converted:
            raise ValueError(
                "MS-AMP converts a model together with its optimizer: pass both to one "
                "accelerator.prepare(model, optimizer, ...) call (prepare_model alone cannot use MS-AMP), "
                "or use fp8_backend='te' or 'ao'"
            )
        return model


def _refuse_fsdp() -> None:

    runtime = rt.current()
    # An FSDP plugin is only in the runtime when the connector chose the FSDP strategy.
    if runtime is not None and runtime.plugins.fsdp is not None:
        raise ValueError(
            "MS-AMP FP8 is not supported with FSDP here (MS-AMP's FP8 weights need its own FSDP "
            "wrapper): use DDP or DeepSpeed with fp8_backend='msamp', or fp8_backend='ao' with FSDP2 "
            "(float8 all-gather)"
        )


def msamp_deepspeed_config(config: Mapping[str, object], opt_level: str = "O2") -> dict[str, object]:
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
