"""Device maps for quantised models: module sizes counted at their quantised width."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import nn

from accelerando.big_modeling.budgets import DeviceKey, DeviceLike, get_balanced_memory
from accelerando.big_modeling.device_map import infer_auto_device_map
from accelerando.big_modeling.quantization.layers import bnb_layers, skipped, strip_tensor_suffix
from accelerando.plugins.bnb import BnbQuantizationConfig

__all__ = ["AUTO_MAPS", "get_quantized_model_device_map"]

# the loader's logger: messages keep the name they had before the split
logger = logging.getLogger("accelerando.big_modeling.quantization")

AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _special_dtypes(model: nn.Module, config: BnbQuantizationConfig) -> dict[str, torch.dtype]:
    special: dict[str, torch.dtype] = {}
    skip = config.skip_modules or []
    keep = config.keep_in_fp32_modules or []
    for name, _ in model.named_parameters():
        owner = strip_tensor_suffix(name)
        if keep and skipped(owner, keep):
            special[name] = torch.float32
        elif skip and skipped(owner, skip) and config.torch_dtype is not None:
            special[name] = config.torch_dtype
    return special


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: str | dict[str, DeviceLike] | None = None,
    max_memory: Mapping[DeviceKey, int | float | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> Mapping[str, DeviceLike]:
    """Choose where each module of a (quantised, usually empty) model goes.

    Sizes count quantised layers at 1 byte (8-bit) or half a byte (4-bit) per weight, the modules in
    ``skip_modules`` at ``torch_dtype`` and ``keep_in_fp32_modules`` at float32.

    Args:
        model: the model, after :func:`replace_with_bnb_layers`.
        bnb_quantization_config: the options (``skip_modules`` / ``keep_in_fp32_modules`` are read).
        device_map: a dict (returned as is), one of ``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
            ``"sequential"``, or None: everything on the current CUDA device, or on CPU without one.
        max_memory: budgets per device for the strategies.
        no_split_module_classes: class names never split across devices.

    Returns:
        The device map.

    Raises:
        ValueError: for an unknown strategy name, or a 4-bit model whose quantised layers a strategy
            would put on CPU (while a GPU runs the model) or on disk: give a dict device_map or more
            ``max_memory`` instead.
    """
    if device_map is None:
        device_map = {"": torch.cuda.current_device()} if torch.cuda.is_available() else {"": "cpu"}
        logger.info("No device_map given: the quantised model goes to %s", device_map[""])
    if isinstance(device_map, dict):
        return device_map
    if not isinstance(device_map, str) or device_map not in AUTO_MAPS:
        raise ValueError(f"device_map must be a dict or one of {list(AUTO_MAPS)}, got {device_map!r}")

    special = _special_dtypes(model, bnb_quantization_config)
    target = bnb_quantization_config.target_dtype
    if device_map != "sequential":
        max_memory = get_balanced_memory(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=target,
            special_dtypes=special,
            low_zero=device_map == "balanced_low_0",
        )
    planned = infer_auto_device_map(
        model,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=target,
        special_dtypes=special,
    )
    runs_on_accelerator = any(value not in ("cpu", "disk") for value in planned.values())
    offloaded = [
        name for name, value in planned.items() if value == "disk" or (value == "cpu" and runs_on_accelerator)
    ]
    converted = {name for name, _ in bnb_layers(model)}
    offloaded_quantized = [
        name
        for name in offloaded
        if any(layer == name or layer.startswith(f"{name}.") or name == "" for layer in converted)
    ]
    if offloaded_quantized and bnb_quantization_config.load_in_4bit:
        raise ValueError(
            f"device_map={planned!r} would offload 4-bit layers ({', '.join(offloaded_quantized)}); "
            "the automatic maps do not offload 4-bit layers: give more max_memory, or pass a dict device_map "
            "that places them yourself"
        )
    if offloaded_quantized:
        logger.info(
            "Modules offloaded to CPU/disk are kept in 8-bit there: %s", ", ".join(offloaded_quantized)
        )
    return planned
