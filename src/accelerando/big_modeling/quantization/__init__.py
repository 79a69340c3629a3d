"""Quantised loading with bitsandbytes (the reference's ``accelerate.utils.bnb`` re-exports it).

Flow of :func:`load_and_quantize_model` for a model built under ``init_empty_weights``:

1. the Linear layers (except the output head, tied weights and ``keep_in_fp32_modules``) become
   ``bnb.nn.Linear8bitLt`` / ``bnb.nn.Linear4bit``, still on ``meta``;
2. a device map is chosen (:func:`get_quantized_model_device_map`), counting quantised sizes;
3. the checkpoint is read by :func:`accelerando.big_modeling.load_checkpoint_in_model` and every weight
   of a quantised layer is quantised where it landed (bitsandbytes quantises on ``.to(device)``);
   8-bit weights mapped to ``"disk"`` are quantised and written as int8 + statistics
   (:func:`quantize_and_offload_8bit`); 4-bit weights mapped to disk stay in ``torch_dtype`` there and
   are quantised each time their module runs;
4. :func:`accelerando.big_modeling.dispatch_model` attaches the offload hooks.

bitsandbytes runs 8-bit and 4-bit layers on CUDA GPUs and, from its 0.45 line on, on CPU; whether
the installed build can run a mode on a device is probed once with a tiny tensor, and a mode that
cannot run raises an error naming what to install or where to run.

The Linear layers of a loaded CPU model are quantised in place on CPU (no GPU round trip).

The package is split by responsibility; each module imports only the ones listed before it:

- :mod:`accelerando.plugins.bnb`: :class:`BnbQuantizationConfig` (the options);
- ``layers``: inspect a model, swap its Linear layers for bnb layers, quantise loaded weights;
- ``device_map``: :func:`get_quantized_model_device_map`;
- ``offload``: :func:`quantize_and_offload_8bit` and the views that feed offloaded weights back.

This module keeps the entry point and the check that bitsandbytes can run a mode (so the
availability checks are looked up here, the one place to replace them, e.g. in tests).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from accelerando.big_modeling import dispatch_model
from accelerando.big_modeling.budgets import DeviceKey, DeviceLike
from accelerando.big_modeling.loading import load_checkpoint_in_model
from accelerando.big_modeling.quantization.device_map import get_quantized_model_device_map
from accelerando.big_modeling.quantization.layers import (
    cast_unquantized,
    get_keys_to_not_convert,
    get_parameter_device,
    has_4bit_bnb_layers,
    quantize_loaded,
    replace_linear_layers,
)
from accelerando.big_modeling.quantization.offload import (
    offload_8bit_disk_weights,
    packed_meta_4bit,
    quantize_and_offload_8bit,
    wrap_offload_hooks,
)
from accelerando.common.imports import is_4bit_bnb_available, is_8bit_bnb_available, is_bnb_available
from accelerando.plugins.bnb import BnbQuantizationConfig

if TYPE_CHECKING:
    from types import ModuleType

# The reference logs this code under its utils path; scripts and tests listen there.
logger = logging.getLogger("accelerando.utils.bnb")

__all__ = [
    "BnbQuantizationConfig",
    "get_keys_to_not_convert",
    "get_parameter_device",
    "get_quantized_model_device_map",
    "has_4bit_bnb_layers",
    "load_and_quantize_model",
    "quantize_and_offload_8bit",
    "replace_with_bnb_layers",
]


# --------------------------------------------------------------------------------------------------
# bitsandbytes availability and what this machine can run
# --------------------------------------------------------------------------------------------------


def _mode(config: BnbQuantizationConfig) -> str:
    return "8-bit" if config.load_in_8bit else "4-bit"


def _import_bnb(config: BnbQuantizationConfig) -> ModuleType:
    """Import bitsandbytes after checking it is installed and recent enough for the config's mode."""
    if not is_bnb_available():
        raise ImportError(
            f"{_mode(config)} loading needs bitsandbytes, which is not installed: `pip install bitsandbytes` "
            "(0.45 or later also runs on CPU)"
        )
    if config.load_in_8bit and not is_8bit_bnb_available():
        raise ImportError(
            "the installed bitsandbytes is too old for 8-bit loading (needs 0.37.2 or later): "
            "`pip install -U bitsandbytes`"
        )
    if config.load_in_4bit and not is_4bit_bnb_available():
        raise ImportError(
            "the installed bitsandbytes is too old for 4-bit loading (needs 0.39.0 or later): "
            "`pip install -U bitsandbytes`"
        )
    import bitsandbytes as bnb

    return bnb


@functools.cache
def _probe(mode: str, device_type: str) -> str | None:
    """Quantise a tiny tensor on ``device_type``; None when it works, else the error text."""
    import bitsandbytes as bnb

    try:
        sample = torch.linspace(-1.0, 1.0, 64, device=device_type).reshape(2, 32)
        if mode == "8-bit":
            bnb.functional.int8_vectorwise_quant(sample.half())
        else:
            bnb.functional.quantize_4bit(sample, quant_type="nf4")
    except Exception as error:  # any failure means this build cannot run the mode there
        return f"{type(error).__name__}: {error}"
    return None


def _check_runs(config: BnbQuantizationConfig, devices: set[str]) -> None:
    """Raise RuntimeError if bitsandbytes cannot quantise in the config's mode on one of ``devices``."""
    import bitsandbytes as bnb

    for device_type in sorted(devices):
        problem = _probe(_mode(config), device_type)
        if problem is not None:
            hint = (
                "upgrade to a bitsandbytes with a CPU backend (`pip install -U 'bitsandbytes>=0.45'`) or load "
                "onto a CUDA GPU"
                if device_type == "cpu"
                else f"check that bitsandbytes supports {device_type!r} devices, or map the model to 'cpu'"
            )
            raise RuntimeError(
                f"bitsandbytes {getattr(bnb, '__version__', '?')} cannot run {_mode(config)} layers on "
                f"{device_type!r} ({problem}); {hint}"
            )


def _device_type(device: int | str | torch.device) -> str:
    # a bare index names a CUDA device, as in the reference's device maps
    return "cuda" if isinstance(device, int) else torch.device(device).type


# --------------------------------------------------------------------------------------------------
# Converting a model (the checked entry to layers.replace_linear_layers)
# --------------------------------------------------------------------------------------------------


def replace_with_bnb_layers(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: list[str] | None = None,
    current_key_name: list[str] | None = None,
) -> nn.Module:
    """Replace the ``nn.Linear`` layers of a model by bitsandbytes 8-bit or 4-bit layers, in place.

    The new layers hold the old weights unquantised (on ``meta`` for an empty model); bitsandbytes
    quantises them when they are moved to a device. A layer is kept when a name in
    ``modules_to_not_convert`` is the layer, one of its parents, or the dotted tail of its name.

    Args:
        model: the model.
        bnb_quantization_config: 8-bit or 4-bit options.
        modules_to_not_convert: module names left as they are (default: none).
        current_key_name: dotted-name parts of ``model`` inside a larger model (used when recursing).

    Returns:
        The model. A warning is logged when no Linear layer was replaced.

    Raises:
        ImportError: if bitsandbytes is missing or too old for the mode.
    """
    bnb = _import_bnb(bnb_quantization_config)
    skip = list(modules_to_not_convert or [])
    replaced = replace_linear_layers(bnb, model, bnb_quantization_config, skip, list(current_key_name or []))
    if not replaced:
        logger.warning(
            "No Linear layer was converted to %s: the model has none outside modules_to_not_convert=%s",
            _mode(bnb_quantization_config),
            skip,
        )
    return model


# --------------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------------


def _resolved_config(
    model: nn.Module, config: BnbQuantizationConfig
) -> tuple[BnbQuantizationConfig, list[str], list[str]]:
    skip = list(config.skip_modules) if config.skip_modules is not None else get_keys_to_not_convert(model)
    keep = list(config.keep_in_fp32_modules or [])
    not_convert = skip + [name for name in keep if name not in skip]
    return dataclasses.replace(config, skip_modules=not_convert), not_convert, keep


def load_and_quantize_model(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: str | os.PathLike | None = None,
    device_map: str | dict[str, DeviceLike] | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: Mapping[DeviceKey, int | float | str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_state_dict: bool = False,
) -> nn.Module:
    """Quantise a model's Linear layers to 8-bit or 4-bit with bitsandbytes, loading weights if needed.

    A model on ``meta`` (built under ``init_empty_weights``) is converted, filled from
    ``weights_location`` tensor by tensor and dispatched along ``device_map`` (CPU / disk offload
    included). A model with real weights is converted and quantised in place on its device;
    ``weights_location`` and ``device_map`` are then not used (a warning says so).

    Kept unquantised: ``skip_modules`` (default: :func:`get_keys_to_not_convert`, the output head and
    tied weights) and ``keep_in_fp32_modules`` (also kept in float32). Other floating tensors of
    unquantised modules take ``torch_dtype`` when it is set. The model gets ``is_loaded_in_8bit`` /
    ``is_loaded_in_4bit`` attributes.

    Args:
        model: the model.
        bnb_quantization_config: 8-bit or 4-bit options.
        weights_location: a checkpoint file, sharded index or folder (required for an empty model).
        device_map: a dict or ``"auto"``/``"balanced"``/``"balanced_low_0"``/``"sequential"``; None puts
            the model on the current CUDA device, or on CPU without one.
        no_split_module_classes: class names never split across devices.
        max_memory: budgets per device for the automatic maps.
        offload_folder: where disk-offloaded weights go (required when the map uses ``"disk"``).
        offload_state_dict: accepted for compatibility; loading streams tensor by tensor already.

    Returns:
        The quantised model.

    Raises:
        ImportError: bitsandbytes is missing or too old for the mode.
        RuntimeError: the installed bitsandbytes cannot run the mode on a device the map uses.
        ValueError: an empty model without ``weights_location``, a disk map without ``offload_folder``,
            or a device map :func:`get_quantized_model_device_map` refuses.
    """
    if not isinstance(bnb_quantization_config, BnbQuantizationConfig):
        raise ValueError(
            "bnb_quantization_config must be a BnbQuantizationConfig, e.g. BnbQuantizationConfig(load_in_8bit=True); "
            f"got {type(bnb_quantization_config).__name__}"
        )
    _import_bnb(bnb_quantization_config)
    config, not_convert, keep = _resolved_config(model, bnb_quantization_config)
    device = get_parameter_device(model)
    if device.type != "meta":
        return _quantize_loaded_model(model, config, not_convert, keep, device, weights_location, device_map)
    if weights_location is None:
        raise ValueError(
            "the model is on the meta device (empty): pass weights_location, the checkpoint file or folder to load"
        )
    replace_with_bnb_layers(model, config, modules_to_not_convert=not_convert)
    _mark(model, config)
    planned = get_quantized_model_device_map(model, config, device_map, max_memory, no_split_module_classes)
    values = set(planned.values())
    uses_disk = "disk" in values
    if uses_disk and offload_folder is None:
        raise ValueError(
            "the device_map sends modules to 'disk': pass offload_folder, the folder to write them to"
        )
    runs_on = {_device_type(value) for value in values if value != "disk"} or {"cpu"}
    _check_runs(config, runs_on)

    load_checkpoint_in_model(
        model,
        weights_location,
        device_map=planned,
        offload_folder=offload_folder,
        dtype=config.torch_dtype,
        offload_state_dict=offload_state_dict,
        keep_in_fp32_modules=keep or None,
        offload_8bit_bnb=config.load_in_8bit and uses_disk,
    )
    quantize_loaded(model)
    if uses_disk and config.load_in_8bit and offload_folder is not None:  # uses_disk required it above
        offload_8bit_disk_weights(model, config, offload_folder)
    if uses_disk and config.load_in_4bit:
        packed_meta_4bit(model)

    dispatch_model(model, device_map=planned, offload_dir=offload_folder)
    wrap_offload_hooks(model)
    return model


def _mark(model: nn.Module, config: BnbQuantizationConfig) -> None:
    # Plain attributes (not tensors or submodules): nn.Module keeps them in the instance __dict__.
    model.__dict__["is_loaded_in_8bit"] = config.load_in_8bit
    model.__dict__["is_loaded_in_4bit"] = config.load_in_4bit


def _quantize_loaded_model(
    model: nn.Module,
    config: BnbQuantizationConfig,
    not_convert: list[str],
    keep: list[str],
    device: torch.device,
    weights_location: str | os.PathLike | None,
    device_map: str | Mapping[str, DeviceLike] | None,
) -> nn.Module:
    logger.warning(
        "Quantising a model that already holds its weights: it briefly needs full-precision memory. Build the "
        "model under init_empty_weights() and pass weights_location to load it quantised tensor by tensor."
    )
    if weights_location is not None or device_map is not None:
        logger.warning(
            "The model already holds its weights, so weights_location=%r and device_map=%r are not used; "
            "build it under init_empty_weights() to load and place it from a checkpoint.",
            weights_location,
            device_map,
        )
    _check_runs(config, {device.type})
    replace_with_bnb_layers(model, config, modules_to_not_convert=not_convert)
    cast_unquantized(model, config, keep)
    quantize_loaded(model)
    _mark(model, config)
    return model
