"""Facts about prepared models: the model inside parallel wrappers, its tensor-parallel degree,
whether it holds distributed tensors, a submodule class by name; and the numpy types a checkpoint of
RNG states may unpickle.

The reference's ``accelerate.utils.other`` path is :mod:`accelerando.utils.other`, which re-exports
these with regional compilation (:mod:`accelerando.common.compilation`), ports
(:mod:`accelerando.common.ports`) and names and sizes (:mod:`accelerando.common.names`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from accelerando.common.compilation import REGIONS_ORIGINAL
from accelerando.common.unwrap import is_compiled_module, unwrap_model

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = [
    "TORCH_SAFE_GLOBALS",
    "extract_model_from_parallel",
    "get_model_tp_size",
    "get_module_class_from_name",
    "model_has_dtensor",
]


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """Return the user's model from inside the wrappers ``prepare`` added.

    Removes ``DistributedDataParallel``, ``DataParallel``, FSDP and DeepSpeed engine wrappers (in
    any nesting with ``torch.compile``). The wrappers themselves are not modified. The one
    implementation is :func:`accelerando.common.unwrap.unwrap_model`, which every strategy's
    ``unwrap_model`` uses too.

    Args:
        model: the prepared model.
        keep_fp32_wrapper: keep the mixed-precision forward wrapper (autocast and fp32 outputs). With
            False, the model's original ``forward`` is put back (this modifies the model).
        keep_torch_compile: when the model was compiled, return a compiled module around the
            unwrapped model rather than the plain module.
        recursive: also replace compiled submodules by their original modules (modifies the model).

    Returns:
        The unwrapped model.

    Raises:
        TypeError: if ``model`` is not a ``torch.nn.Module``.
    """
    model = unwrap_model(
        model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile, recursive=recursive
    )
    original = model.__dict__.get(REGIONS_ORIGINAL)
    if not keep_torch_compile and not is_compiled_module(model) and isinstance(original, torch.nn.Module):
        # A module compile_regions returned: hand back the module it was built from.
        return unwrap_model(original, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=False)
    return model


# --- distributed tensors -------------------------------------------------------------------------------


def _dtensor_class() -> type[DTensor] | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Tell whether any parameter of ``model`` is a ``DTensor`` (sharded by FSDP2 or tensor parallelism).

    Args:
        model: any module.

    Returns:
        True when at least one parameter is a distributed tensor.
    """
    dtensor = _dtensor_class()
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def get_model_tp_size(model: torch.nn.Module) -> int | None:
    """Return the tensor-parallel degree a model was sharded with, or None when it was not.

    A ``tp_size`` (or ``_tp_size``) attribute set by transformers' tensor-parallel loading is used
    first; otherwise the device mesh of the model's distributed parameters is asked for its ``"tp"``
    dimension.

    Args:
        model: the (unwrapped or wrapped) model.

    Returns:
        The tensor-parallel size (1 or more), or None when the model is not tensor parallel.
    """
    model = unwrap_model(model, keep_torch_compile=False)
    for name in ("tp_size", "_tp_size"):
        size = getattr(model, name, None)
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
            return size
    # transformers >= 5 records the degree in the config's distributed_config (a dict after a JSON
    # round trip) and leaves `model.tp_size` as a None stub.
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    size = (
        distributed.get("tp_size")
        if isinstance(distributed, Mapping)
        else getattr(distributed, "tp_size", None)
    )
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size
    dtensor = _dtensor_class()
    if dtensor is None:
        return None
    for parameter in model.parameters():
        if isinstance(parameter, dtensor):
            mesh = parameter.device_mesh
            names = mesh.mesh_dim_names or ()
            if "tp" in names:
                return int(mesh.size(names.index("tp")))
    return None


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type | None:
    """Find, inside ``module``, a submodule whose class is called ``name`` and return that class.

    FSDP's transformer-based wrapping uses this to turn layer class names from a config
    (``"GPT2Block"``) into classes.

    Args:
        module: the model to search (``module`` itself included).
        name: a class name, without the module path.

    Returns:
        The first matching class in depth-first order, or None when no submodule has that class.
    """
    for submodule in module.modules():
        if type(submodule).__name__ == name:
            return type(submodule)
    return None


def _safe_globals() -> list[Callable[..., object]]:
    """The numpy types a checkpoint of RNG states pickles (for ``torch.serialization.add_safe_globals``)."""
    import codecs

    try:
        import numpy as np  # torch imports it already when installed
    except ImportError:
        return []
    core = getattr(np, "_core", None) or getattr(np, "core")  # noqa: B009 - numpy < 2 only, gone from 2's stubs
    return [core.multiarray._reconstruct, np.ndarray, codecs.encode, np.dtype, type(np.dtype(np.uint32))]


# Allow-list for ``torch.load(weights_only=True)`` of files holding numpy RNG states (empty without numpy).
TORCH_SAFE_GLOBALS: list[Callable[..., object]] = _safe_globals()
