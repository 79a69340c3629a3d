"""torchao FP8 training helpers: choose the Linear layers to convert and convert them to ``Float8Linear``.

torchao's ``Float8Linear`` keeps its weight in high precision and casts inputs, weights and gradients
to float8 (dynamic tensorwise scales) for the three matmuls. Conversion needs dimensions divisible by
16; the first and last Linear layers (embedding projection, output head) are the most sensitive to
rounding and stay in high precision by default.

torchao is imported inside the functions only, so importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from accelerando.common.imports import is_torchao_available, torchao_required

if TYPE_CHECKING:  # pragma: no cover
    from torchao.float8 import Float8LinearConfig

__all__ = [
    "convert_model_to_fp8_ao",
    "default_module_filter",
    "float8_config_for",
    "filter_first_and_last_linear_layers",
    "filter_linear_layers",
    "find_first_last_linear_layers",
    "has_ao_layers",
]

# Names of the first and last Linear layers of the model being converted right now, so that
# ``filter_first_and_last_linear_layers`` (which torchao calls with one sub-module at a time) knows them.
_CONVERTING: contextvars.ContextVar[tuple[str | None, str | None] | None] = contextvars.ContextVar(
    "accelerando_ao_first_last", default=None
)


def find_first_last_linear_layers(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """Qualified names of the first and last ``torch.nn.Linear`` of ``model``, in registration order.

    Args:
        model: any module.

    Returns:
        ``(first, last)``; both None when the model has no Linear layer (the same name twice with one).
    """
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    if not names:
        return None, None
    return names[0], names[-1]


def filter_linear_layers(module: torch.nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Module filter: whether ``module`` (at qualified name ``fqn``) may become a ``Float8Linear``.

    Args:
        module: the candidate sub-module.
        fqn: its qualified name in the model.
        layers_to_filter: qualified names that must stay in high precision.

    Returns:
        True for a Linear whose in and out features are both divisible by 16 and whose name is not
        in ``layers_to_filter``; False otherwise.
    """
    if not isinstance(module, torch.nn.Linear):
        return False
    if module.in_features % 16 != 0 or module.out_features % 16 != 0:
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: torch.nn.Module, fqn: str) -> bool:
    """Module filter keeping the first and last Linear layers of the model in high precision.

    During :func:`convert_model_to_fp8_ao` the first and last layers are those of the model being
    converted; called on its own, those of ``module`` itself.

    Args:
        module: the candidate sub-module.
        fqn: its qualified name in the model.

    Returns:
        What :func:`filter_linear_layers` answers with the first and last Linear layers filtered out.
    """
    first_last = _CONVERTING.get()
    if first_last is None:
        first_last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, [name for name in first_last if name is not None])


def has_ao_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` contains torchao ``Float8Linear`` layers (False when torchao is not installed)."""
    if not is_torchao_available():
        return False
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


@contextlib.contextmanager
def _converting(model: torch.nn.Module) -> Iterator[None]:
    token = _CONVERTING.set(find_first_last_linear_layers(model))
    try:
        yield
    finally:
        _CONVERTING.reset(token)


@torchao_required
def convert_model_to_fp8_ao(
    model: torch.nn.Module,
    config: Float8LinearConfig | None = None,
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None,
) -> torch.nn.Module:
    """Swap the eligible ``torch.nn.Linear`` layers of ``model`` for torchao ``Float8Linear``, in place.

    Args:
        model: the model (its weights are kept as the high-precision master weights).
        config: a ``torchao.float8.Float8LinearConfig`` (torchao's default when None). Without a GPU
            that computes in FP8 pass ``Float8LinearConfig(emulate=True)``; the Accelerator chooses this
            for you.
        module_filter_func: ``(module, fqn) -> bool`` selecting the layers to convert; default
            :func:`filter_first_and_last_linear_layers` (dims divisible by 16, first and last kept).

    Returns:
        ``model`` itself, converted.

    Raises:
        ImportError: torchao is not installed.
        TypeError: ``config`` is not a Float8LinearConfig.
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if config is None:
        config = Float8LinearConfig()
    elif not isinstance(config, Float8LinearConfig):
        raise TypeError(
            f"config must be a torchao.float8.Float8LinearConfig, got {type(config).__name__}; "
            "build one with Float8LinearConfig(...) or pass AORecipeKwargs(config=...)"
        )
    if module_filter_func is None:
        module_filter_func = filter_first_and_last_linear_layers
    before = dict(model.named_parameters(remove_duplicate=False))
    with _converting(model):
        convert_to_float8_training(model, module_filter_fn=module_filter_func, config=config)
    _keep_parameter_identity(model, before)
    return model


def _keep_parameter_identity(model: torch.nn.Module, before: dict[str, torch.nn.Parameter]) -> None:
    """Put the new (wrapped) weights into the original Parameter objects.

    With ``enable_fsdp_float8_all_gather`` torchao wraps each weight in a new Parameter (a tensor
    subclass around the old one). An optimizer built before the conversion, and FSDP's re-pointing of
    it, know the old objects; swapping the contents keeps them valid.
    """
    for name, new in list(model.named_parameters(remove_duplicate=False)):
        old = before.get(name)
        if old is None or old is new:
            continue
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        flatten = getattr(new, "__tensor_flatten__", None)  # a tensor subclass (Float8 weights)
        inner = [a for a in flatten()[0] if getattr(new, a) is old] if flatten is not None else []
        torch.utils.swap_tensors(old, new)
        for a in inner:  # the wrapper held ``old``, whose contents now live in ``new``
            setattr(old, a, new)
        setattr(module, attr, old)


def default_module_filter(model: torch.nn.Module) -> Callable[[torch.nn.Module, str], bool]:
    """The default filter bound to ``model``: dims divisible by 16, its first and last Linear kept.

    Useful to convert a model by hand exactly as the Accelerator does
    (``convert_to_float8_training(model, module_filter_fn=default_module_filter(model), config=...)``).
    """
    first, last = find_first_last_linear_layers(model)
    return functools.partial(
        filter_linear_layers, layers_to_filter=[n for n in (first, last) if n is not None]
    )


def float8_config_for(
    config: Float8LinearConfig, *, emulate: bool | None = None, fsdp_all_gather: bool | None = None
) -> Float8LinearConfig:
    """A copy of a ``Float8LinearConfig`` with ``emulate`` / ``enable_fsdp_float8_all_gather`` replaced.

    Args:
        config: the Float8LinearConfig to copy.
        emulate: new ``emulate`` (None keeps it).
        fsdp_all_gather: new ``enable_fsdp_float8_all_gather`` (None keeps it).

    Returns:
        The new config (the given one when nothing changes).
    """
    import dataclasses

    changes: dict[str, bool] = {}
    if emulate is not None and config.emulate != emulate:
        changes["emulate"] = emulate
    if fsdp_all_gather is not None and config.enable_fsdp_float8_all_gather != fsdp_all_gather:
        changes["enable_fsdp_float8_all_gather"] = fsdp_all_gather
    return dataclasses.replace(config, **changes) if changes else config
