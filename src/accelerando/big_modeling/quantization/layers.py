"""Inspect a model, turn its Linear layers into bitsandbytes layers, and quantise loaded weights.

bitsandbytes itself is imported inside the functions that use it: importing this module needs torch
only. The public wrapper :func:`accelerando.big_modeling.quantization.replace_with_bnb_layers` checks that
bitsandbytes can run the config's mode before calling :func:`replace_linear_layers`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from accelerando.big_modeling.tensors import find_tied_parameters
from accelerando.common.imports import is_bnb_available
from accelerando.plugins.bnb import BnbQuantizationConfig

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "bnb_layers",
    "cast_unquantized",
    "get_keys_to_not_convert",
    "get_parameter_device",
    "has_4bit_bnb_layers",
    "is_quantized",
    "quantize_loaded",
    "replace_linear_layers",
    "skipped",
    "strip_tensor_suffix",
]


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """Return the device of a module's first parameter (or, without parameters, its first buffer).

    Raises:
        ValueError: if the module holds no tensor at all.
    """
    for tensor in parameter.parameters():
        return tensor.device
    for tensor in parameter.buffers():
        return tensor.device
    raise ValueError(f"{type(parameter).__name__} has no parameters or buffers, so it has no device")


def strip_tensor_suffix(name: str) -> str:
    """Drop a trailing ``.weight`` / ``.bias`` from a tensor name, leaving its module's name."""
    for suffix in (".weight", ".bias"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """Names of the modules to keep unquantised by default: tied weights and the output head.

    The output head is the module owning the model's last parameter. A transformers base model (one
    without a head, recognised by ``base_model_prefix``) without tied weights keeps nothing.

    Returns:
        Module names (``".weight"`` / ``".bias"`` removed), tied ones first.
    """
    tied = [name for group in find_tied_parameters(model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = isinstance(prefix, str) and not hasattr(model, prefix)
    if not tied and is_base_model:
        return []
    names = list(tied)
    param_names = [name for name, _ in model.named_parameters()]
    last = param_names[-1] if param_names else None
    if last is not None and last not in tied:
        names.append(last)
    result: list[str] = []
    for name in names:
        stripped = strip_tensor_suffix(name)
        if stripped not in result:
            result.append(stripped)
    return result


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Tell whether a model holds ``bnb.nn.Linear4bit`` layers (False when bitsandbytes is missing)."""
    if not is_bnb_available():
        return False
    import bitsandbytes as bnb

    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def skipped(full_name: str, modules_to_not_convert: list[str]) -> bool:
    """A module is skipped when a listed name is the module, one of its parents, or its dotted tail."""
    for key in modules_to_not_convert:
        if full_name == key or full_name.endswith(f".{key}"):
            return True
        if full_name.startswith(f"{key}.") or f".{key}." in f".{full_name}":
            return True
    return False


def _bnb_linear(bnb: ModuleType, linear: nn.Linear, config: BnbQuantizationConfig) -> nn.Module:
    """Build the bitsandbytes layer replacing ``linear``, holding the same (not yet quantised) weights."""
    has_bias = linear.bias is not None
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(
            linear.in_features,
            linear.out_features,
            has_bias,
            has_fp16_weights=False,
            threshold=config.llm_int8_threshold,
            device="meta",
        )
        layer.weight = bnb.nn.Int8Params(linear.weight.data, requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            has_bias,
            config.bnb_4bit_compute_dtype,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
            device="meta",
        )
        layer.weight = bnb.nn.Params4bit(
            linear.weight.data,
            requires_grad=False,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
            module=layer,
        )
    if has_bias:
        layer.bias = nn.Parameter(linear.bias.data, requires_grad=False)
    layer.train(linear.training)
    return layer


def replace_linear_layers(
    bnb: ModuleType, module: nn.Module, config: BnbQuantizationConfig, skip: list[str], path: list[str]
) -> bool:
    """Replace, in place and recursively, the ``nn.Linear`` children of ``module`` by bnb layers.

    Args:
        bnb: the imported bitsandbytes module (the caller checked it can run the config's mode).
        module: the module whose children are visited.
        config: 8-bit or 4-bit options.
        skip: module names kept as they are (see :func:`skipped`).
        path: dotted-name parts of ``module`` inside the model.

    Returns:
        Whether at least one layer was replaced.
    """
    bnb_classes = (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)
    replaced = False
    for name, child in list(module.named_children()):
        full = ".".join([*path, name])
        if skipped(full, skip):
            continue
        if isinstance(child, nn.Linear) and not isinstance(child, bnb_classes):
            module._modules[name] = _bnb_linear(bnb, child, config)
            replaced = True
        elif replace_linear_layers(bnb, child, config, skip, [*path, name]):
            replaced = True
    return replaced


def bnb_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Yield ``(name, module)`` for every bitsandbytes 8-bit or 4-bit Linear layer of ``model``."""
    import bitsandbytes as bnb

    for name, module in model.named_modules():
        if isinstance(module, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)):
            yield name, module


def is_quantized(weight: torch.Tensor) -> bool:
    """Tell whether a bnb weight already holds quantised data (int8, or a quantised ``Params4bit``)."""
    return weight.dtype == torch.int8 or bool(getattr(weight, "bnb_quantized", False))


def quantize_loaded(model: nn.Module) -> int:
    """Quantise, on its current device, every bnb weight that holds real, unquantised data."""
    count = 0
    for _, module in bnb_layers(model):
        weight = module.weight
        assert isinstance(weight, torch.Tensor)  # a bnb layer's weight is a parameter
        if weight.device.type == "meta" or is_quantized(weight):
            continue
        device = weight.device
        # bitsandbytes quantises when an unquantised weight moves to a real device (CPU included); an
        # Int8Params quantises only on a move that starts on CPU, so one already elsewhere goes via CPU.
        if weight.dtype != torch.int8 and not hasattr(weight, "bnb_quantized") and device.type != "cpu":
            weight = weight.cpu()
        # bitsandbytes' parameter classes return their own class from .to(); its stubs say Tensor.
        module._parameters["weight"] = weight.to(device)  # pyright: ignore[reportArgumentType]
        count += 1
    return count


def cast_unquantized(model: nn.Module, config: BnbQuantizationConfig, keep_fp32: list[str]) -> None:
    """Cast the floating tensors of the unquantised modules: float32 for keep_in_fp32_modules, else torch_dtype."""
    quantized = {name for name, _ in bnb_layers(model)}
    for name, param in model.named_parameters():
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        if owner in quantized or not param.is_floating_point():
            continue
        if keep_fp32 and skipped(owner, keep_fp32):
            param.data = param.data.to(torch.float32)
        elif config.torch_dtype is not None:
            param.data = param.data.to(config.torch_dtype)
