"""Regional compilation: ``torch.compile`` of each repeated block of a model instead of the whole model.

Applied by ``TorchDynamoPlugin.compile`` (``use_regional_compilation``) when a model is prepared, and
undone by :func:`accelerando.common.unwrap.unwrap_model` (``keep_torch_compile=False``), which reads
the original module the compiled copy records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict, TypeGuard

import torch

from accelerando.common.unwrap import is_compiled_module

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CompileKwargs",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_repeated_blocks",
]


class CompileKwargs(TypedDict, total=False):
    """The keyword arguments of ``torch.compile`` that regional compilation passes on."""

    fullgraph: bool
    dynamic: bool | None
    backend: str | Callable[..., object]
    mode: str | None
    options: dict[str, str | int | bool | Callable[..., object]] | None
    disable: bool


# Key under which compile_regions records, on the module it returns, the module it was given.
REGIONS_ORIGINAL = "_orig_mod"


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
    if REGIONS_ORIGINAL not in compiled.__dict__:
        compiled.__dict__[REGIONS_ORIGINAL] = module
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
