"""NVIDIA Transformer Engine helpers: swap layers for TE ones and run their forward under FP8 autocast.

Transformer Engine needs a CUDA GPU (FP8 from compute capability 8.9, MXFP8 on Blackwell) and the
``transformer_engine`` package; both are looked up at call time. Without them every function that
needs them raises an ImportError that names torchao ("ao") as the FP8 backend that runs everywhere.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from accelerando.common.imports import is_transformer_engine_available

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "apply_fp8_autowrap",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
    "te_recipe",
]

_ORIGINAL_FORWARD = "_accelerando_te_original_forward"
# TERecipeKwargs' defaults, for a handler that leaves a field unset (or none at all).
_TE_DEFAULTS: dict[str, object] = {
    "margin": 0,
    "interval": 1,
    "fp8_format": "HYBRID",
    "amax_history_len": 1024,
    "amax_compute_algo": "most_recent",
    "override_linear_precision": (False, False, False),
    "use_mxfp8_block_scaling": False,
}


class _TELinear(Protocol):
    """What :func:`_from_te` reads of a ``transformer_engine.pytorch.Linear`` (the package ships no types)."""

    @property
    def in_features(self) -> int: ...

    @property
    def out_features(self) -> int: ...

    @property
    def weight(self) -> torch.Tensor: ...


class _TELayerNorm(Protocol):
    """What :func:`_from_te` reads of a ``transformer_engine.pytorch.LayerNorm``."""

    @property
    def eps(self) -> float: ...

    @property
    def weight(self) -> torch.Tensor: ...


def _require_te(what: str) -> ModuleType:

    if not is_transformer_engine_available():
        raise ImportError(
            f"{what} needs NVIDIA Transformer Engine (pip install transformer-engine[pytorch]) and a CUDA GPU "
            "with FP8 support; on this machine use the torchao backend instead: "
            "Accelerator(mixed_precision='fp8', kwargs_handlers=[AORecipeKwargs()]) or --fp8_backend ao"
        )
    import transformer_engine.pytorch as te

    return te


def has_transformer_engine_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` contains Transformer Engine layers (False when the package is absent)."""
    if not is_transformer_engine_available():
        return False
    import transformer_engine.pytorch as te

    kinds = tuple(getattr(te, n) for n in ("LayerNorm", "Linear", "TransformerLayer") if hasattr(te, n))
    return any(isinstance(module, kinds) for module in model.modules())


def _weight(module: torch.nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor)  # the layers converted here all hold a weight parameter
    return weight


def _copy_params(target: torch.nn.Module, source: torch.nn.Module) -> None:
    with torch.no_grad():
        _weight(target).copy_(_weight(source))
        source_bias, target_bias = getattr(source, "bias", None), getattr(target, "bias", None)
        if source_bias is not None and target_bias is not None:
            target_bias.copy_(source_bias)


def _to_te(te: ModuleType, module: torch.nn.Module, linear: bool, norm: bool) -> torch.nn.Module | None:
    if linear and type(module) is torch.nn.Linear:
        # TE's FP8 GEMMs need both dimensions divisible by 16; other layers stay as they are.
        if module.in_features % 16 or module.out_features % 16:
            return None
        new = te.Linear(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            params_dtype=module.weight.dtype,
            device=module.weight.device,
        )
    elif norm and type(module) is torch.nn.LayerNorm:
        new = te.LayerNorm(
            module.normalized_shape[0],
            eps=module.eps,
            params_dtype=module.weight.dtype,
            device=module.weight.device,
        )
    else:
        return None
    _copy_params(new, module)
    return new


def _from_te(te: ModuleType, module: torch.nn.Module, linear: bool, norm: bool) -> torch.nn.Module | None:
    if linear and isinstance(module, te.Linear):
        layer = cast("_TELinear", module)  # Transformer Engine ships no type information
        weight = layer.weight
        new: torch.nn.Module = torch.nn.Linear(
            layer.in_features,
            layer.out_features,
            bias=getattr(module, "use_bias", getattr(module, "bias", None) is not None),
            dtype=weight.dtype,
            device=weight.device,
        )
    elif norm and isinstance(module, te.LayerNorm):
        norm_layer = cast("_TELayerNorm", module)  # Transformer Engine ships no type information
        weight = norm_layer.weight
        new = torch.nn.LayerNorm(
            weight.shape[0], eps=norm_layer.eps, dtype=weight.dtype, device=weight.device
        )
    else:
        return None
    _copy_params(new, module)
    return new


def convert_model(
    model: torch.nn.Module,
    to_transformer_engine: bool = True,
    _convert_linear: bool = True,
    _convert_ln: bool = True,
) -> None:
    """Swap ``torch.nn.Linear`` / ``LayerNorm`` layers for Transformer Engine ones (or back), in place.

    Weights are copied. Linear layers with a dimension not divisible by 16 are left as they are.

    Args:
        model: the model to convert.
        to_transformer_engine: True: torch -> TE; False: TE -> torch.
        _convert_linear, _convert_ln: which layer kinds to convert.

    Raises:
        ImportError: Transformer Engine is not installed (the message names the "ao" backend).
    """
    te = _require_te("convert_model")
    swap: Callable[..., torch.nn.Module | None] = _to_te if to_transformer_engine else _from_te
    for name, child in list(model.named_children()):
        new = swap(te, child, _convert_linear, _convert_ln)
        if new is None:
            convert_model(child, to_transformer_engine, _convert_linear, _convert_ln)
        else:
            setattr(model, name, new)


# Returns Any: a transformer_engine recipe object (the package ships no type information).
def te_recipe(handler: object = None) -> Any:
    """The Transformer Engine recipe a ``TERecipeKwargs`` / ``FP8RecipeKwargs`` describes.

    ``DelayedScaling`` by default; ``MXFP8BlockScaling`` with ``use_mxfp8_block_scaling=True``. Fields
    the installed Transformer Engine no longer accepts (e.g. ``interval``) are left out.

    Raises:
        ImportError: Transformer Engine is not installed.
    """
    _require_te("an FP8 recipe")
    from transformer_engine.common import recipe as te_recipes

    # Any: a recipe field's value as the handler holds it (a str, int, bool or tuple; TE checks it).
    def field(name: str) -> Any:
        value = getattr(handler, name, None)
        return _TE_DEFAULTS[name] if value is None else value

    fmt = getattr(te_recipes.Format, str(field("fp8_format")).upper())
    if field("use_mxfp8_block_scaling"):
        return te_recipes.MXFP8BlockScaling(fp8_format=fmt)
    wanted: dict[str, object] = {
        "margin": field("margin"),
        "interval": field("interval"),
        "fp8_format": fmt,
        "amax_history_len": field("amax_history_len"),
        "amax_compute_algo": field("amax_compute_algo"),
    }
    override = tuple(field("override_linear_precision"))
    if any(override):
        wanted["override_linear_precision"] = te_recipes._OverrideLinearPrecision(*override)
    accepted = inspect.signature(te_recipes.DelayedScaling).parameters
    return te_recipes.DelayedScaling(**{k: v for k, v in wanted.items() if k in accepted})


def contextual_fp8_autocast(
    model_forward: Callable[..., object], fp8_recipe: object, use_during_eval: bool = False
) -> Callable[..., object]:
    """Wrap a forward so that it runs under Transformer Engine's FP8 autocast.

    The returned function takes the module as first argument (bind it with ``types.MethodType``);
    FP8 is enabled in training mode, and in eval mode only with ``use_during_eval=True``.

    Raises:
        ImportError: Transformer Engine is not installed.
    """
    te = _require_te("contextual_fp8_autocast")

    def forward(self: torch.nn.Module, *args: object, **kwargs: object) -> object:
        enabled = use_during_eval or self.training
        with te.fp8_autocast(enabled=enabled, fp8_recipe=fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward  # type: ignore[attr-defined]
    return forward


def apply_fp8_autowrap(model: torch.nn.Module, fp8_recipe_handler: object) -> torch.nn.Module:
    """Make ``model.forward`` run under FP8 autocast with the recipe ``fp8_recipe_handler`` describes.

    Args:
        model: a model with Transformer Engine layers (see :func:`convert_model`).
        fp8_recipe_handler: a ``TERecipeKwargs`` / ``FP8RecipeKwargs`` (None: the defaults).

    Returns:
        ``model`` (its forward replaced once; the original is kept for unwrapping).

    Raises:
        ImportError: Transformer Engine is not installed.
    """
    recipe = te_recipe(fp8_recipe_handler)
    if getattr(model, _ORIGINAL_FORWARD, None) is not None:
        return model
    use_during_eval = bool(getattr(fp8_recipe_handler, "use_autocast_during_eval", False))
    original = model.forward
    model.forward = types.MethodType(contextual_fp8_autocast(original, recipe, use_during_eval), model)  # type: ignore[method-assign]
    setattr(model, _ORIGINAL_FORWARD, original)
    return model
