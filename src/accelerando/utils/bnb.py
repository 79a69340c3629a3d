"""Quantised loading with bitsandbytes: the reference's ``accelerate.utils.bnb``.

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
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accelerando.enums import CustomDtype
from accelerando.utils.imports import is_4bit_bnb_available, is_8bit_bnb_available, is_bnb_available

logger = logging.getLogger(__name__)

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

_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


# --------------------------------------------------------------------------------------------------
# The config
# --------------------------------------------------------------------------------------------------
# Names accepted for the compute dtype of 4-bit layers (the reference's three spellings first).
_COMPUTE_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_QUANT_TYPES = ("fp4", "nf4")


def _as_dtype(value: Any, field_name: str) -> torch.dtype:
    """Turn a dtype name or ``torch.dtype`` into a floating ``torch.dtype``; raise ValueError otherwise."""
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        if key not in _COMPUTE_DTYPES:
            raise ValueError(
                f"{field_name}={value!r} is not a dtype name this config knows; use one of "
                f"{sorted(_COMPUTE_DTYPES)} or a torch.dtype such as torch.float16"
            )
        return _COMPUTE_DTYPES[key]
    if isinstance(value, torch.dtype):
        if not value.is_floating_point:
            raise ValueError(f"{field_name} must be a floating-point dtype, got {value}")
        return value
    raise ValueError(
        f"{field_name} must be a string such as 'fp16' or a torch.dtype, got {type(value).__name__} ({value!r})"
    )


def _check_names(value: Any, field_name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"{field_name} must be a list of module names (strings), got {value!r}")
    return value


@dataclass
class BnbQuantizationConfig:
    """Options for loading a model with its Linear layers quantised by bitsandbytes.

    Exactly one of ``load_in_8bit`` / ``load_in_4bit`` must be True.

    Args:
        load_in_8bit: replace Linear layers by ``bnb.nn.Linear8bitLt`` (LLM.int8()).
        llm_int8_threshold: outlier threshold of LLM.int8(): activation columns with a value above it
            are computed in 16-bit (0 disables the decomposition).
        load_in_4bit: replace Linear layers by ``bnb.nn.Linear4bit``.
        bnb_4bit_quant_type: 4-bit data type, ``"fp4"`` or ``"nf4"``.
        bnb_4bit_use_double_quant: also quantise the 4-bit scaling constants (saves ~0.4 bit/param).
        bnb_4bit_compute_dtype: dtype 4-bit layers compute in: ``"fp32"``, ``"fp16"``, ``"bf16"`` or a
            ``torch.dtype``; becomes a ``torch.dtype``.
        torch_dtype: dtype of the weights left unquantised (a ``torch.dtype`` or a name); None keeps the
            checkpoint's dtype.
        skip_modules: module names never quantised (default: the output head and tied weights, found
            by :func:`~accelerando.utils.bnb.get_keys_to_not_convert`).
        keep_in_fp32_modules: module names kept unquantised and in float32.

    Attributes:
        target_dtype: ``torch.int8`` for 8-bit, ``CustomDtype.INT4`` for 4-bit (sizes for device maps).

    Raises:
        ValueError: for a field of the wrong type, both or neither of ``load_in_8bit`` /
            ``load_in_4bit``, an unknown 4-bit quantisation type, or an unknown dtype name.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = field(default=None)

    def __post_init__(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        threshold = self.llm_int8_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(f"llm_int8_threshold must be a number, got {threshold!r}")
        self.llm_int8_threshold = float(threshold)
        if self.bnb_4bit_quant_type not in _QUANT_TYPES:
            raise ValueError(f"bnb_4bit_quant_type must be 'fp4' or 'nf4', got {self.bnb_4bit_quant_type!r}")
        self.bnb_4bit_compute_dtype = _as_dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        if self.torch_dtype is not None:
            self.torch_dtype = _as_dtype(self.torch_dtype, "torch_dtype")
        self.skip_modules = _check_names(self.skip_modules, "skip_modules")
        self.keep_in_fp32_modules = _check_names(self.keep_in_fp32_modules, "keep_in_fp32_modules")
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("load_in_8bit and load_in_4bit are both True: choose one of them")
        if not (self.load_in_8bit or self.load_in_4bit):
            raise ValueError(
                "set load_in_8bit=True or load_in_4bit=True: a quantization config needs one of them"
            )
        self.target_dtype: torch.dtype | CustomDtype = torch.int8 if self.load_in_8bit else CustomDtype.INT4


# --------------------------------------------------------------------------------------------------
# bitsandbytes availability and what this machine can run
# --------------------------------------------------------------------------------------------------


def _mode(config: BnbQuantizationConfig) -> str:
    return "8-bit" if config.load_in_8bit else "4-bit"


def _import_bnb(config: BnbQuantizationConfig) -> Any:
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
# Inspecting and converting models
# --------------------------------------------------------------------------------------------------


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


def _strip_tensor_suffix(name: str) -> str:
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
    from accelerando.utils.modeling import find_tied_parameters

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
        stripped = _strip_tensor_suffix(name)
        if stripped not in result:
            result.append(stripped)
    return result


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Tell whether a model holds ``bnb.nn.Linear4bit`` layers (False when bitsandbytes is missing)."""
    if not is_bnb_available():
        return False
    import bitsandbytes as bnb

    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def _skipped(full_name: str, modules_to_not_convert: list[str]) -> bool:
    """A module is skipped when a listed name is the module, one of its parents, or its dotted tail."""
    for key in modules_to_not_convert:
        if full_name == key or full_name.endswith(f".{key}"):
            return True
        if full_name.startswith(f"{key}.") or f".{key}." in f".{full_name}":
            return True
    return False


def _bnb_linear(bnb: Any, linear: nn.Linear, config: BnbQuantizationConfig) -> nn.Module:
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
    replaced = _replace(bnb, model, bnb_quantization_config, skip, list(current_key_name or []))
    if not replaced:
        logger.warning(
            "No Linear layer was converted to %s: the model has none outside modules_to_not_convert=%s",
            _mode(bnb_quantization_config),
            skip,
        )
    return model


def _replace(
    bnb: Any, module: nn.Module, config: BnbQuantizationConfig, skip: list[str], path: list[str]
) -> bool:
    bnb_classes = (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)
    replaced = False
    for name, child in list(module.named_children()):
        full = ".".join([*path, name])
        if _skipped(full, skip):
            continue
        if isinstance(child, nn.Linear) and not isinstance(child, bnb_classes):
            module._modules[name] = _bnb_linear(bnb, child, config)
            replaced = True
        elif _replace(bnb, child, config, skip, [*path, name]):
            replaced = True
    return replaced


def _bnb_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    import bitsandbytes as bnb

    for name, module in model.named_modules():
        if isinstance(module, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)):
            yield name, module


def _is_quantized(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.int8 or bool(getattr(weight, "bnb_quantized", False))


def _quantize_loaded(model: nn.Module) -> int:
    """Quantise, on its current device, every bnb weight that holds real, unquantised data."""
    count = 0
    for _, module in _bnb_layers(model):
        weight = module.weight
        if weight.device.type == "meta" or _is_quantized(weight):
            continue
        device = weight.device
        # bitsandbytes quantises when an unquantised weight moves to a real device (CPU included); an
        # Int8Params quantises only on a move that starts on CPU, so one already elsewhere goes via CPU.
        if weight.dtype != torch.int8 and not hasattr(weight, "bnb_quantized") and device.type != "cpu":
            weight = weight.cpu()
        module._parameters["weight"] = weight.to(device)
        count += 1
    return count


def _cast_unquantized(model: nn.Module, config: BnbQuantizationConfig, keep_fp32: list[str]) -> None:
    """Cast the floating tensors of the unquantised modules: float32 for keep_in_fp32_modules, else torch_dtype."""
    quantized = {name for name, _ in _bnb_layers(model)}
    for name, param in model.named_parameters():
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        if owner in quantized or not param.is_floating_point():
            continue
        if keep_fp32 and _skipped(owner, keep_fp32):
            param.data = param.data.to(torch.float32)
        elif config.torch_dtype is not None:
            param.data = param.data.to(config.torch_dtype)


# --------------------------------------------------------------------------------------------------
# Device maps and disk offload
# --------------------------------------------------------------------------------------------------


def _special_dtypes(model: nn.Module, config: BnbQuantizationConfig) -> dict[str, torch.dtype]:
    special: dict[str, torch.dtype] = {}
    skip = config.skip_modules or []
    keep = config.keep_in_fp32_modules or []
    for name, _ in model.named_parameters():
        owner = _strip_tensor_suffix(name)
        if keep and _skipped(owner, keep):
            special[name] = torch.float32
        elif skip and _skipped(owner, skip) and config.torch_dtype is not None:
            special[name] = config.torch_dtype
    return special


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: str | dict[str, int | str | torch.device] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> dict[str, int | str | torch.device]:
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
    if not isinstance(device_map, str) or device_map not in _AUTO_MAPS:
        raise ValueError(f"device_map must be a dict or one of {list(_AUTO_MAPS)}, got {device_map!r}")
    from accelerando.utils.modeling import get_balanced_memory, infer_auto_device_map

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
    device_map = infer_auto_device_map(
        model,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=target,
        special_dtypes=special,
    )
    runs_on_accelerator = any(value not in ("cpu", "disk") for value in device_map.values())
    offloaded = [
        name
        for name, value in device_map.items()
        if value == "disk" or (value == "cpu" and runs_on_accelerator)
    ]
    converted = {name for name, _ in _bnb_layers(model)}
    offloaded_quantized = [
        name
        for name in offloaded
        if any(layer == name or layer.startswith(f"{name}.") or name == "" for layer in converted)
    ]
    if offloaded_quantized and bnb_quantization_config.load_in_4bit:
        raise ValueError(
            f"device_map={device_map!r} would offload 4-bit layers ({', '.join(offloaded_quantized)}); "
            "the automatic maps do not offload 4-bit layers: give more max_memory, or pass a dict device_map "
            "that places them yourself"
        )
    if offloaded_quantized:
        logger.info(
            "Modules offloaded to CPU/disk are kept in 8-bit there: %s", ", ".join(offloaded_quantized)
        )
    return device_map


def quantize_and_offload_8bit(
    model: nn.Module,
    param: torch.Tensor,
    param_name: str,
    new_dtype: torch.dtype | None,
    offload_folder: str | os.PathLike,
    offload_index: dict,
    fp16_statistics: torch.Tensor | None,
) -> dict:
    """Write an 8-bit weight to an offload folder and leave the model's tensor on ``meta``.

    With ``fp16_statistics`` None, ``param`` holds the full-precision weight: it is quantised here (on
    CPU) into int8 rows and their scales. Otherwise ``param`` is already int8 and ``fp16_statistics``
    its scales. Both are written (the scales as ``<module>.SCB``) and recorded in ``offload_index``.

    Args:
        model: the model owning the tensor.
        param: the weight (or bias, which is written as is).
        param_name: its dotted name.
        new_dtype: dtype for a non-weight tensor (None keeps it).
        offload_folder: the offload folder.
        offload_index: the index, updated in place.
        fp16_statistics: the scales of an already quantised weight, or None.

    Returns:
        The updated index.
    """
    from accelerando.utils.modeling import set_module_tensor_to_device
    from accelerando.utils.offload import offload_weight

    if param_name.endswith("weight") and (fp16_statistics is not None or param.is_floating_point()):
        if fp16_statistics is None:
            import bitsandbytes as bnb

            int8, fp16_statistics, _ = bnb.functional.int8_vectorwise_quant(
                param.detach().to("cpu", torch.float16).contiguous()
            )
            param = int8
        offload_weight(param, param_name, offload_folder, index=offload_index)
        offload_weight(
            fp16_statistics, f"{param_name[: -len('weight')]}SCB", offload_folder, index=offload_index
        )
    else:
        value = param if new_dtype is None or not param.is_floating_point() else param.to(new_dtype)
        offload_weight(value, param_name, offload_folder, index=offload_index)
    set_module_tensor_to_device(model, param_name, "meta", value=torch.empty(*param.size(), device="meta"))
    return offload_index


class _QuantizingWeights(Mapping):
    """The offloaded weights of one hooked module, returned as bitsandbytes parameters.

    An int8 weight with its ``SCB`` next to it becomes an ``Int8Params`` carrying the scales; a
    full-precision weight of a 4-bit layer is quantised into a ``Params4bit``. Everything else passes
    through unchanged.
    """

    def __init__(self, weights: Mapping, root: nn.Module) -> None:
        self.weights = weights
        self.root = root

    def __getitem__(self, key: str) -> torch.Tensor:
        value = self.weights[key]
        owner_name, _, leaf = key.rpartition(".")
        if leaf != "weight":
            return value
        owner = self.root.get_submodule(owner_name) if owner_name else self.root
        import bitsandbytes as bnb

        if isinstance(owner, bnb.nn.Linear8bitLt) and value.dtype == torch.int8:
            scb_key = f"{owner_name}.SCB" if owner_name else "SCB"
            statistics = self.weights[scb_key]
            return bnb.nn.Int8Params(
                value, requires_grad=False, has_fp16_weights=False, CB=value, SCB=statistics
            )
        if isinstance(owner, bnb.nn.Linear4bit) and value.is_floating_point():
            template = owner.weight
            fresh = bnb.nn.Params4bit(
                value,
                requires_grad=False,
                blocksize=template.blocksize,
                compress_statistics=template.compress_statistics,
                quant_type=template.quant_type,
                quant_storage=template.quant_storage,
                module=owner,
            )
            return fresh.to(value.device if value.device.type != "meta" else "cpu")
        return value

    def __contains__(self, key: object) -> bool:
        return key in self.weights

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


def _wrap_offload_hooks(model: nn.Module) -> int:
    """Make the offload hooks of a dispatched model hand bnb layers bitsandbytes parameters."""
    wrapped = 0
    for _, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        for single in getattr(hook, "hooks", [hook]):
            weights = getattr(single, "weights_map", None)
            if (
                getattr(single, "offload", False)
                and weights is not None
                and not isinstance(weights, _QuantizingWeights)
            ):
                single.weights_map = _QuantizingWeights(weights, module)
                wrapped += 1
    return wrapped


def _packed_meta_4bit(model: nn.Module) -> None:
    """Give the disk-offloaded 4-bit weights (still on ``meta``) the packed shape their quantised values have."""
    import bitsandbytes as bnb

    for _, module in _bnb_layers(model):
        weight = module.weight
        if not isinstance(module, bnb.nn.Linear4bit) or weight.device.type != "meta" or _is_quantized(weight):
            continue
        # two 4-bit values per byte of quant_storage, stored as a column
        per_item = 2 * weight.quant_storage.itemsize
        rows = (weight.numel() + per_item - 1) // per_item
        module._parameters["weight"] = bnb.nn.Params4bit(
            torch.empty(rows, 1, dtype=weight.quant_storage, device="meta"),
            requires_grad=False,
            blocksize=weight.blocksize,
            compress_statistics=weight.compress_statistics,
            quant_type=weight.quant_type,
            quant_storage=weight.quant_storage,
            module=module,
            bnb_quantized=True,
        )


def _read_index(offload_folder: str | os.PathLike | None) -> dict:
    import json

    if offload_folder is None:
        return {}
    path = os.path.join(offload_folder, "index.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _offload_8bit_disk_weights(
    model: nn.Module, config: BnbQuantizationConfig, offload_folder: str | os.PathLike
) -> None:
    """Replace the full-precision disk copies of 8-bit weights by int8 rows + scales."""
    from accelerando.utils.offload import OffloadedWeightsLoader, save_offload_index

    index = _read_index(offload_folder)
    if not index:
        return
    loader = OffloadedWeightsLoader(save_folder=offload_folder, index=index)
    import bitsandbytes as bnb

    updated: dict = {}
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear8bitLt):
            continue
        key = f"{name}.weight" if name else "weight"
        if key in index and index[key]["dtype"] != "int8":
            quantize_and_offload_8bit(
                model, loader[key], key, config.torch_dtype, offload_folder, updated, None
            )
    save_offload_index(updated, offload_folder)


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
    device_map: dict[str, int | str | torch.device] | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
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
    device_map = get_quantized_model_device_map(
        model, config, device_map, max_memory, no_split_module_classes
    )
    values = set(device_map.values())
    uses_disk = "disk" in values
    if uses_disk and offload_folder is None:
        raise ValueError(
            "the device_map sends modules to 'disk': pass offload_folder, the folder to write them to"
        )
    runs_on = {_device_type(value) for value in values if value != "disk"} or {"cpu"}
    _check_runs(config, runs_on)
    from accelerando.utils.modeling import load_checkpoint_in_model

    load_checkpoint_in_model(
        model,
        weights_location,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=config.torch_dtype,
        offload_state_dict=offload_state_dict,
        keep_in_fp32_modules=keep or None,
        offload_8bit_bnb=config.load_in_8bit and uses_disk,
    )
    _quantize_loaded(model)
    if uses_disk and config.load_in_8bit:
        _offload_8bit_disk_weights(model, config, offload_folder)
    if uses_disk and config.load_in_4bit:
        _packed_meta_4bit(model)
    from accelerando.big_modeling import dispatch_model

    dispatch_model(model, device_map=device_map, offload_dir=offload_folder)
    _wrap_offload_hooks(model)
    return model


def _mark(model: nn.Module, config: BnbQuantizationConfig) -> None:
    model.is_loaded_in_8bit = config.load_in_8bit
    model.is_loaded_in_4bit = config.load_in_4bit


def _quantize_loaded_model(
    model: nn.Module,
    config: BnbQuantizationConfig,
    not_convert: list[str],
    keep: list[str],
    device: torch.device,
    weights_location: str | os.PathLike | None,
    device_map: Any,
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
    _cast_unquantized(model, config, keep)
    _quantize_loaded(model)
    _mark(model, config)
    return model
