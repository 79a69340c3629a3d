"""Byte sizes of modules and tensors: the numbers every device-map decision is made from.

All functions here read shapes and dtypes only, so they work on models built on the ``meta`` device.
Sizes are computed in one pass over the model's tensors; each tensor's size is added to all of its
ancestors, so the cost is (number of tensors) x (nesting depth), never quadratic in the module count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping

import torch
from torch import nn

__all__ = [
    "calculate_maximum_sizes",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "dtype_byte_size",
    "get_max_layer_size",
    "get_module_leaves",
    "named_module_tensors",
    "parse_dtype",
    "sizes_of_modules",
    "walk_modules",
]

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "double": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
}

# Sub-byte storage formats named by string (quantised weights) and their size in bytes per element.
_STRING_DTYPE_BYTES: dict[str, float] = {
    "int4": 0.5,
    "fp4": 0.5,
    "nf4": 0.5,
    "int2": 0.25,
    "int8": 1.0,
    "fp8": 1.0,
}


def _get_proper_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The reference's private ``accelerate.utils.modeling._get_proper_dtype`` (diffusers' tests import it).

    A string names a ``torch`` attribute once every ``"torch."`` in it is removed (``"float16"``,
    ``"torch.bfloat16"``, ``"float"``), as the reference reads it; anything else comes back as it is.

    Args:
        dtype: a dtype name or a ``torch.dtype``.

    Returns:
        The ``torch`` attribute the name gives, or ``dtype`` itself when it is not a string.

    Raises:
        AttributeError: ``torch`` has no attribute of that name (as the reference raises).
    """
    if not isinstance(dtype, str):
        return dtype
    return getattr(torch, dtype.replace("torch.", ""))


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str | None:
    """Normalise a dtype given as a ``torch.dtype`` or a name (``"float16"``, ``"torch.bfloat16"``).

    Args:
        dtype: the dtype, its name, or None.

    Returns:
        A ``torch.dtype``, a sub-byte format name such as ``"int4"`` (kept as a string), or None.

    Raises:
        TypeError: if ``dtype`` is neither a ``torch.dtype`` nor a string.
        ValueError: if the name is unknown.
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(
            f"dtype must be a torch.dtype or its name, got {type(dtype).__name__}; pass e.g. torch.float16."
        )
    name = dtype.removeprefix("torch.")
    if name in _DTYPE_NAMES:
        return _DTYPE_NAMES[name]
    if name in _STRING_DTYPE_BYTES:
        return name
    found = getattr(torch, name, None)
    if isinstance(found, torch.dtype):
        return found
    raise ValueError(
        f"Unknown dtype {dtype!r}; use a torch dtype name such as 'float32', 'float16' or 'bfloat16'."
    )


def dtype_byte_size(dtype: torch.dtype | str) -> float:
    """Return the number of bytes one element of ``dtype`` takes.

    ``torch.bool`` counts as one bit (``1 / 8``), as in the reference; sub-byte storage formats named
    by string count their fraction (``"int4"``: 0.5, ``"int2"``: 0.25).

    Args:
        dtype: a ``torch.dtype`` or a name accepted by :func:`parse_dtype`.

    Returns:
        Bytes per element (a float for sub-byte formats, else an int).

    Raises:
        ValueError: for an unknown dtype name (see :func:`parse_dtype`).
    """
    parsed = parse_dtype(dtype)
    if isinstance(parsed, str):
        return _STRING_DTYPE_BYTES[parsed]
    if parsed == torch.bool:
        return 1 / 8
    assert parsed is not None  # parse_dtype returns None only for None, which is not a dtype here
    return parsed.itemsize


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the parameters (then, optionally, the buffers) of a module with their names.

    Args:
        module: the module to read.
        include_buffers: also yield buffers.
        recurse: include the tensors of submodules (names are then dotted paths).
        remove_non_persistent: skip buffers registered with ``persistent=False`` (they are not in
            the state dict, so a checkpoint never holds them).

    Returns:
        An iterator of ``(name, tensor)`` pairs.
    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skip: set[str] = set()
    if remove_non_persistent:
        modules = module.named_modules() if recurse else [("", module)]
        for prefix, sub in modules:
            for buffer_name in sub._non_persistent_buffers_set:
                skip.add(f"{prefix}.{buffer_name}" if prefix else buffer_name)
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skip:
            yield name, buffer


_KEPT_DTYPE_PREFIXES = ("torch.uint", "torch.int", "torch.bool")


def _tensor_size(
    name: str,
    tensor: torch.Tensor,
    dtype: torch.dtype | str | None,
    special_dtypes: Mapping[str, torch.dtype | str] | None,
) -> float:
    if special_dtypes is not None and name in special_dtypes:
        return tensor.numel() * dtype_byte_size(special_dtypes[name])
    own = dtype_byte_size(tensor.dtype)
    if dtype is None or str(tensor.dtype).startswith(_KEPT_DTYPE_PREFIXES):
        # Integer and boolean tensors (token ids, masks, quantised storage) are never recast.
        return tensor.numel() * own
    return tensor.numel() * min(dtype_byte_size(dtype), own)


def walk_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """List ``(name, module)`` pairs in pre-order, each module once, reading ``_modules`` directly.

    Equivalent to ``model.named_modules()`` but several times faster on models with thousands of
    modules, which matters for device-map inference.

    Args:
        model: the root module.

    Returns:
        The pairs, root first (named ``""``).
    """
    ordered: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        name, module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        ordered.append((name, module))
        children = module._modules
        if children:
            prefix = f"{name}." if name else ""
            stack.extend(
                (prefix + key, child) for key, child in reversed(children.items()) if child is not None
            )
    return ordered


def compute_module_sizes(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    buffers_only: bool = False,
) -> dict[str, int | float]:
    """Compute the size in bytes of every module (and every tensor) of a model.

    The parameters are counted first, then the buffers, each in ``named_parameters()`` /
    ``named_buffers()`` order: a tensor shared by several modules (tied weights) counts once, under
    its first name, and a module holding no tensor of its own is absent (the result is a
    ``defaultdict(int)``, so it reads as 0). Each tensor's size is added to the tensor's name and to
    every enclosing module's name, the whole model being ``""``. Sizes are floats when boolean tensors
    (one bit per element) are involved.

    Args:
        model: the model; may live on the ``meta`` device.
        dtype: if given, floating-point tensors are counted as if cast to this dtype (never upcast:
            a float16 weight stays 2 bytes per element when ``dtype`` is float32); integer and boolean
            tensors keep their size.
        special_dtypes: exact per-tensor dtypes that override ``dtype`` (tensor name -> dtype).
        buffers_only: count buffers only.

    Returns:
        A ``defaultdict(int)`` mapping module and tensor names to bytes.

    Raises:
        ValueError: for an unknown dtype name.

    Example:
        >>> import torch
        >>> from accelerando.utils import compute_module_sizes
        >>> sizes = compute_module_sizes(torch.nn.Linear(4, 2))  # 8 + 2 float32 values
        >>> sizes[""], sizes["weight"], sizes["bias"]
        (40, 32, 8)
    """
    dtype = parse_dtype(dtype)
    sizes: defaultdict[str, int | float] = defaultdict(int)
    tensors = model.named_buffers() if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        size = _tensor_size(name, tensor, dtype, special_dtypes)
        sizes[""] += size
        end = name.find(".")
        while end != -1:
            sizes[name[:end]] += size
            end = name.find(".", end + 1)
        sizes[name] += size
    return sizes


def sizes_of_modules(
    modules: list[tuple[str, nn.Module]],
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    buffers_only: bool = False,
) -> dict[str, int | float]:
    """:func:`compute_module_sizes` of the root of a pre-order list from :func:`walk_modules`.

    Args:
        modules: the pre-order ``(name, module)`` list (its first entry is the root).
        dtype: see :func:`compute_module_sizes`.
        special_dtypes: see :func:`compute_module_sizes`.
        buffers_only: see :func:`compute_module_sizes`.

    Returns:
        Sizes by name, as :func:`compute_module_sizes` returns them.
    """
    if not modules:
        return defaultdict(int)
    return compute_module_sizes(modules[0][1], dtype, special_dtypes, buffers_only)


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
) -> int | float:
    """Return the total size in bytes of a model's buffers.

    Args:
        model: the model.
        dtype: count floating-point buffers as if cast to this dtype.
        special_dtypes: per-tensor dtype overrides.

    Returns:
        The buffer bytes (0 for a model without buffers).
    """
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get(
        "", 0
    )


def get_max_layer_size(
    modules: list[tuple[str, nn.Module | torch.Tensor]],
    module_sizes: Mapping[str, int | float],
    no_split_module_classes: list[str] | None,
) -> tuple[int | float, list[str]]:
    """Find the largest unit that can not be split further: a leaf, or a module of a no-split class.

    Args:
        modules: ``(name, module)`` pairs to start from (usually the model's named children).
        module_sizes: sizes from :func:`compute_module_sizes`.
        no_split_module_classes: class names whose instances are kept whole.

    Returns:
        ``(size, names)``: the largest size and every unit name that has it (as in the reference, units
        of size 0 are listed while nothing larger was found).
    """
    no_split = set(no_split_module_classes or ())
    max_size: int | float = 0
    names: list[str] = []
    stack = list(reversed(modules))
    while stack:
        name, module = stack.pop()
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or type(module).__name__ in no_split:
            try:
                size = module_sizes[name]  # a defaultdict records the name, as the reference's does
            except KeyError:
                size = 0
            if size > max_size:
                max_size, names = size, [name]
            elif size == max_size:
                names.append(name)
        else:
            prefix = f"{name}." if name else ""
            stack.extend((prefix + child_name, child) for child_name, child in reversed(children))
    return max_size, names


def calculate_maximum_sizes(model: nn.Module) -> tuple[int | float, tuple[int | float, list[str]]]:
    """Return the total size of a model and its largest layer, as the memory estimator reports them.

    Args:
        model: the model (``meta`` is fine).

    Returns:
        ``(total_bytes, (largest_layer_bytes, largest_layer_names))``. Modules the model declares in
        ``_no_split_modules`` (transformers models do) count as single layers.
    """
    sizes = compute_module_sizes(model)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    total = sizes.get("", 0)
    # The root's own tensors are units too, as in the reference.
    units = [
        *model.named_parameters(recurse=False),
        *model.named_children(),
        *model.named_buffers(recurse=False),
    ]
    largest = get_max_layer_size(units, sizes, no_split)
    return total, largest


def get_module_leaves(module_sizes: Mapping[str, object]) -> list[str]:
    """Names in a size dict that have nothing under them (tensors, and modules without tensors).

    Args:
        module_sizes: name -> bytes, as returned by ``compute_module_sizes`` (``""`` is the model).

    Returns:
        The leaf names, in the dict's order (``""`` is never a leaf).
    """
    parents = {name.rpartition(".")[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]
