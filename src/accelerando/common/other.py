"""Small general helpers: unwrapping prepared models, regional compilation, merging dicts, naming
objects, sizes in words, ports; plus the reference's re-exports at this path (``save``, ``load``,
``wait_for_everyone``, ``check_os_kernel``...).
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, TypedDict, TypeGuard, TypeVar

import torch

from accelerando.common.constants import FSDP_PYTORCH_VERSION
from accelerando.common.environment import check_os_kernel
from accelerando.common.operations import wait_for_everyone
from accelerando.common.serialization import clean_state_dict_for_safetensors, load, save
from accelerando.common.unwrap import is_compiled_module, unwrap_model
from accelerando.core.settings.machine import free_port

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from typing_extensions import Unpack

_K = TypeVar("_K")


class CompileKwargs(TypedDict, total=False):
    """The keyword arguments of ``torch.compile`` that regional compilation passes on."""

    fullgraph: bool
    dynamic: bool | None
    backend: str | Callable[..., object]
    mode: str | None
    options: dict[str, str | int | bool | Callable[..., object]] | None
    disable: bool


__all__ = [
    "FSDP_PYTORCH_VERSION",
    "TORCH_SAFE_GLOBALS",
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_free_port",
    "get_model_tp_size",
    "get_module_class_from_name",
    "get_pretty_name",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_compiled_module",
    "is_port_in_use",
    "is_repeated_blocks",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
]

# Key under which compile_regions records, on the module it returns, the module it was given.
_REGIONS_ORIGINAL = "_orig_mod"


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
    original = model.__dict__.get(_REGIONS_ORIGINAL)
    if not keep_torch_compile and not is_compiled_module(model) and isinstance(original, torch.nn.Module):
        # A module compile_regions returned: hand back the module it was built from.
        return unwrap_model(original, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=False)
    return model


def merge_dicts(
    source: Mapping[_K, object], destination: MutableMapping[_K, object]
) -> MutableMapping[_K, object]:
    """Recursively merge ``source`` into ``destination`` (in place); values of ``source`` win.

    Nested mappings present on both sides are merged key by key rather than replaced.

    Args:
        source: the dict whose values are copied in.
        destination: the dict updated in place.

    Returns:
        ``destination``, updated.

    Raises:
        TypeError: if either argument is not a mapping.
    """
    if not isinstance(source, Mapping) or not isinstance(destination, MutableMapping):
        raise TypeError(
            f"merge_dicts(source, destination) needs two dicts, got {type(source).__name__} and "
            f"{type(destination).__name__}."
        )
    for key, value in source.items():
        existing = destination.get(key)
        if isinstance(value, Mapping) and isinstance(existing, MutableMapping):
            merge_dicts(value, existing)
        elif isinstance(value, Mapping):
            destination[key] = merge_dicts(value, {})
        else:
            destination[key] = value
    return destination


def get_pretty_name(obj: object) -> str:
    """Return a readable name for a function, class or instance.

    Args:
        obj: anything.

    Returns:
        The qualified name of a function or class, the class's qualified name for an instance, or
        ``str(obj)`` when neither exists.
    """
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    for attribute in ("__qualname__", "__name__"):
        if hasattr(obj, attribute):
            return getattr(obj, attribute)
    return str(obj)


_UNITS = ("bytes", "KB", "MB", "GB", "TB")


def convert_bytes(size: float) -> str:
    """Write a number of bytes in the largest binary unit that keeps it at 1 or more.

    Units step by 1024 (``KB`` = 1024 bytes), values are rounded to two decimals:
    ``convert_bytes(1536)`` is ``"1.5 KB"``, ``convert_bytes(3 * 2**30)`` is ``"3.0 GB"``.

    Args:
        size: a number of bytes (not negative).

    Returns:
        The size with its unit, from ``bytes`` up to ``PB``.

    Raises:
        ValueError: if ``size`` is negative.
        TypeError: if ``size`` is not a number.

    Example:
        >>> from accelerando.utils import convert_bytes
        >>> convert_bytes(1536)
        '1.5 KB'
    """
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise TypeError(f"convert_bytes takes a number of bytes, got {type(size).__name__}.")
    if size < 0:
        raise ValueError(f"convert_bytes takes a non-negative number of bytes, got {size}.")
    value: float = size
    for unit in _UNITS:
        if value < 1024.0:
            return f"{round(value, 2)} {unit}"
        value /= 1024.0
    return f"{round(value, 2)} PB"


def recursive_getattr(obj: object, attr: str) -> object:
    """Read a dotted attribute path: ``recursive_getattr(model, "encoder.layer.0")``.

    Args:
        obj: the object to start from.
        attr: attribute names separated by dots.

    Returns:
        The attribute at the end of the path.

    Raises:
        AttributeError: naming the first attribute of the path that does not exist.
    """
    return functools.reduce(getattr, attr.split("."), obj)


# --- ports ------------------------------------------------------------------------------------------------

_DEFAULT_MAIN_PORT = 29500


def is_port_in_use(port: int | None = None) -> bool:
    """Tell whether something already listens on ``port`` of this machine's loopback interface.

    The launcher asks this before starting a job on the default rendezvous port.

    Args:
        port: the TCP port; ``None`` checks the default main-process port, 29500.

    Returns:
        True when a connection to ``127.0.0.1:port`` is accepted.
    """
    if port is None:
        port = _DEFAULT_MAIN_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", int(port))) == 0


def get_free_port() -> int:
    """Return a TCP port that was free on this machine a moment ago (for a rendezvous).

    Returns:
        A port number chosen by the operating system.
    """
    return free_port()


# --- regional compilation --------------------------------------------------------------------------------


def is_repeated_blocks(module: torch.nn.Module) -> TypeGuard[torch.nn.ModuleList]:
    """Tell whether ``module`` is a non-empty ``ModuleList`` of blocks of one class (transformer layers).

    Args:
        module: any module.

    Returns:
        True for a ``torch.nn.ModuleList`` whose items are all instances of its first item's class.
    """
    if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
        return False
    first = type(module[0])
    return all(isinstance(block, first) for block in module)


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """Tell whether ``module`` or any module inside it is a list of repeated blocks.

    Args:
        module: any module.

    Returns:
        True when :func:`is_repeated_blocks` holds for ``module`` or one of its submodules.
    """
    return any(is_repeated_blocks(submodule) for submodule in module.modules())


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Tell whether some submodule of ``module`` (not ``module`` itself) was compiled with ``torch.compile``.

    Args:
        module: any module.

    Returns:
        True when a child, at any depth, is a compiled wrapper (``OptimizedModule``).
    """
    return any(
        is_compiled_module(submodule) for _, submodule in module.named_modules() if submodule is not module
    )


def _check_module(module: object, name: str) -> None:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{name} compiles a torch.nn.Module, got {type(module).__name__}.")


def _compiled(module: torch.nn.Module, compile_kwargs: CompileKwargs) -> torch.nn.Module:
    compiled = torch.compile(module, **compile_kwargs)
    assert isinstance(compiled, torch.nn.Module)  # compiling a module gives an OptimizedModule
    return compiled


def _compile_regions(module: torch.nn.Module, compile_kwargs: CompileKwargs) -> torch.nn.Module:
    if is_repeated_blocks(module):
        return torch.nn.ModuleList(_compiled(block, compile_kwargs) for block in module)
    if has_repeated_blocks(module):
        # A shallow copy: same parameters and buffers, own table of children, so the original module
        # keeps its plain children and unwrapping can return it.
        copy = module.__class__.__new__(module.__class__)
        copy.__dict__.update(module.__dict__)
        copy._modules = {}
        for child_name, child in module.named_children():
            copy.add_module(child_name, _compile_regions(child, compile_kwargs))
        return copy
    return _compiled(module, compile_kwargs)


def compile_regions(module: torch.nn.Module, **compile_kwargs: Unpack[CompileKwargs]) -> torch.nn.Module:
    """Compile each repeated block of ``module`` once instead of the whole model ("regional compilation").

    Transformer layers are identical, so dynamo compiles the first and reuses the code for the others:
    compile time drops sharply for the same speed. Lists of blocks of one class are found at any
    depth; every block of such a list is wrapped by ``torch.compile``. A model without repeated blocks
    is compiled whole.

    The original ``module`` is left untouched: the result shares its parameters and records it, so
    :func:`extract_model_from_parallel` (``keep_torch_compile=False``) returns it.

    Args:
        module: the model.
        **compile_kwargs: passed to ``torch.compile`` (``backend``, ``mode``, ``fullgraph``, ``dynamic``...).

    Returns:
        A module that runs the compiled blocks.

    Raises:
        TypeError: if ``module`` is not a ``torch.nn.Module``.
    """
    _check_module(module, "compile_regions")
    compiled = _compile_regions(module, compile_kwargs)
    if _REGIONS_ORIGINAL not in compiled.__dict__:
        compiled.__dict__[_REGIONS_ORIGINAL] = module
    return compiled


def _compile_in_place(module: torch.nn.Module, compile_kwargs: CompileKwargs) -> None:
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            _compile_in_place(child, compile_kwargs)
    else:
        module.compile(**compile_kwargs)


def compile_regions_deepspeed(module: torch.nn.Module, **compile_kwargs: Unpack[CompileKwargs]) -> None:
    """Regional compilation in place, for a model DeepSpeed has wrapped or will wrap.

    DeepSpeed keeps references to the modules it hooks, so no module may be replaced: each repeated
    block (or, without any, the whole model) is compiled with ``nn.Module.compile``, which changes how
    the module runs and keeps the object.

    Args:
        module: the model (or the engine's ``module``).
        **compile_kwargs: passed to ``torch.compile``.

    Raises:
        TypeError: if ``module`` is not a ``torch.nn.Module``.
    """
    _check_module(module, "compile_regions_deepspeed")
    _compile_in_place(module, compile_kwargs)


def compile_regions_fsdp2(
    module: torch.nn.Module, **compile_kwargs: Unpack[CompileKwargs]
) -> torch.nn.Module:
    """Regional compilation in place, for a model sharded with FSDP2 (``fully_shard``).

    ``fully_shard`` registers its hooks and sharded parameters on the module objects themselves, so
    they are compiled in place (``nn.Module.compile``), never replaced.

    Args:
        module: the sharded model.
        **compile_kwargs: passed to ``torch.compile``.

    Returns:
        ``module`` itself, now running compiled blocks.

    Raises:
        TypeError: if ``module`` is not a ``torch.nn.Module``.
    """
    _check_module(module, "compile_regions_fsdp2")
    _compile_in_place(module, compile_kwargs)
    return module


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
