"""Memory budgets per device: parse user budgets, read free memory, balance across accelerators."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping

import torch
from torch import nn

from accelerando.big_modeling.sizes import compute_module_sizes, get_module_leaves
from accelerando.core.devices.detect import backend_for
from accelerando.core.settings.fields import quote_value

__all__ = [
    "DeviceKey",
    "check_device_visible",
    "convert_file_size_to_int",
    "get_balanced_memory",
    "get_max_memory",
    "normalize_device_key",
]

DeviceKey = int | str
# What a device map or an execution device may name: an index, a string ("cuda:1", "cpu", "disk") or a device.
DeviceLike = int | str | torch.device

logger = logging.getLogger("accelerando.big_modeling.budgets")

_UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")
# Accelerator families addressed as "<family>:<index>"; plain integers mean the default accelerator.
_INDEXED_FAMILIES = ("cuda", "xpu", "npu", "mlu", "sdaa", "musa", "hpu")
_SIZE_FORMS = "an int of bytes or a string such as '10GiB' or '500MB'"


def as_class_name_list(no_split_module_classes: object) -> list:
    """``no_split_module_classes`` as given to the placement functions (None, one name, a set, a list) as a list."""
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, (set, frozenset, list, tuple)):
        return list(no_split_module_classes)
    return [no_split_module_classes]


def convert_file_size_to_int(size: int | float | str) -> int:
    """Convert a size given as bytes or as a string with a unit to a number of bytes.

    Decimal units (``KB``, ``MB``, ``GB``, ``TB``) are powers of 1000 and binary units (``KiB``,
    ``MiB``, ``GiB``, ``TiB``) powers of 1024; units are case-insensitive and a fraction such as
    ``"1.5GB"`` is allowed.

    Args:
        size: bytes as an int (or float), or a string such as ``"10GB"``, ``"10GiB"`` or ``"500MB"``.

    Returns:
        The number of bytes.

    Raises:
        ValueError: for a negative size or a string that is not a number followed by a known unit.
        TypeError: for any other type.
    """
    if isinstance(size, bool) or not isinstance(size, (int, float, str)):
        raise TypeError(f"A memory size must be an int or a string like '10GiB', got {type(size).__name__}.")
    if isinstance(size, (int, float)):
        if isinstance(size, float) and not math.isfinite(size):
            raise ValueError(
                f"A memory size must be a finite number of bytes, got {size}: use {_SIZE_FORMS}."
            )
        if size < 0:
            raise ValueError(f"A memory size can not be negative, got {size}: use {_SIZE_FORMS}.")
        return int(size)
    match = _SIZE_PATTERN.match(size[:100])  # a size is a few characters; a huge string never matches
    unit = match.group(2).upper() if match and len(size) <= 100 else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"Can not read the memory size {quote_value(size)}: write a number of bytes or a number followed by "
            "one of KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. '10GiB'."
        )
    return int(float(match.group(1)) * _UNITS[unit])


def normalize_device_key(key: int | str | torch.device) -> DeviceKey:
    """Bring a device name to the form used in device maps and budgets.

    ``0``, ``"0"`` and ``"cuda:0"`` all become ``0``; ``"cpu"``, ``"disk"``, ``"mps"`` and
    ``"meta"`` stay strings; other accelerators keep their ``"xpu:0"`` form.

    Args:
        key: an index, a device string or a ``torch.device``.

    Returns:
        The normalised key.

    Raises:
        ValueError: for a device name that is not recognised.
    """
    if isinstance(key, torch.device):
        key = str(key) if key.index is not None or key.type != "cuda" else "cuda:0"
    if isinstance(key, bool):
        raise ValueError(
            f"Unknown device {key!r}; use an index (0), 'cuda:0', 'cpu', 'disk', 'mps' or 'xpu:0'."
        )
    if not isinstance(key, (int, str)):
        raise ValueError(
            f"Unknown device {quote_value(key)} ({type(key).__name__}); use an index (0), 'cuda:0', 'cpu', 'disk', "
            "'mps' or 'xpu:0'."
        )
    if isinstance(key, int):
        if key < 0:
            raise ValueError(f"Device index must be >= 0, got {key}.")
        return key
    text = str(key).strip().lower()
    if text.isdigit():
        return int(text)
    if text in ("cpu", "disk", "mps", "meta"):
        return text
    family, _, index = text.partition(":")
    if family == "cuda" and (index == "" or index.isdigit()):
        return int(index or 0)
    if family in _INDEXED_FAMILIES and (index == "" or index.isdigit()):
        return f"{family}:{index or 0}"
    raise ValueError(
        f"Unknown device {quote_value(key)} in max_memory/device_map; use an accelerator index (0), 'cuda:0', "
        "'xpu:0', 'npu:0', 'mps', 'cpu' or 'disk'."
    )


# Devices already found present (as given -> normalised key): hooks place tensors at every forward, and
# a check then costs one dict lookup.
_VISIBLE: dict[int | str | torch.device, DeviceKey] = {}


def _visible_count(family: str) -> int:

    try:
        return backend_for(family).device_count()
    except ValueError:  # a family without a backend class here (mlu, sdaa, musa): ask torch directly
        module = getattr(torch, family, None)
        if module is None or not hasattr(module, "device_count") or not module.is_available():
            return 0
        return int(module.device_count())


def check_device_visible(device: int | str | torch.device, what: str = "device_map") -> DeviceKey:
    """Check that a device named in a device map (or as an execution device) exists on this machine.

    Args:
        device: an index, a device string or a ``torch.device``.
        what: where the device was named, for the message (``"device_map['encoder']"``).

    Returns:
        The normalised device key (see :func:`normalize_device_key`).

    Raises:
        ValueError: for an unknown device name, or an accelerator that is not visible here; the
            message names the device and the fix.
    """
    known = None if isinstance(device, bool) else _VISIBLE.get(device)  # True == 1 as a dict key
    if known is not None:
        return known
    key = normalize_device_key(device)
    if key in ("cpu", "disk", "meta"):
        return key
    if isinstance(key, int):
        family, index = "cuda", key
    elif key == "mps":
        family, index = "mps", 0
    else:
        family, _, number = key.partition(":")
        index = int(number)
    count = _visible_count(family)
    if index < count:
        _VISIBLE[device] = key
        return key
    seen = (
        f"no {family} device is visible"
        if count == 0
        else f"only {count} {family} device(s) are visible (indices 0 to {count - 1})"
    )
    shown = repr(str(device)) if isinstance(device, torch.device) else quote_value(device)
    raise ValueError(
        f"{what} places weights on device {shown} ({family}:{index}), but {seen} on this machine. "
        "Fix: use device_map={'': 'cpu'}, or device_map='auto' (it uses only the devices present), or run "
        "where that device exists (check CUDA_VISIBLE_DEVICES)."
    )


def _device_order(key: DeviceKey) -> tuple[int, str, int]:
    if isinstance(key, int):
        return (0, "", key)
    if ":" in key:
        family, _, index = key.partition(":")
        return (1, family, int(index))
    return ({"mps": 2, "cpu": 3, "disk": 4}.get(key, 5), key, 0)


def _free_memory() -> dict[DeviceKey, int]:
    import psutil

    budget: dict[DeviceKey, int] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            try:
                budget[index] = torch.cuda.mem_get_info(index)[0]
            except RuntimeError:  # a device that is visible but unusable (e.g. in a bad state)
                budget[index] = 0
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        for index in range(xpu.device_count()):
            budget[f"xpu:{index}"] = xpu.get_device_properties(index).total_memory - xpu.memory_allocated(
                index
            )
    if torch.backends.mps.is_available():
        budget["mps"] = psutil.virtual_memory().available
    budget["cpu"] = psutil.virtual_memory().available
    return budget


def get_max_memory(max_memory: Mapping[DeviceKey, int | float | str] | None = None) -> dict[DeviceKey, int]:
    """Return the memory budget of every device, in bytes, sorted accelerators first, then cpu, disk.

    Args:
        max_memory: the budgets the user chose (device -> bytes or a size string). If None, the free
            memory of every visible device is read (free accelerator memory, available RAM).

    Returns:
        A dict from normalised device keys (see :func:`normalize_device_key`) to bytes.

    Raises:
        ValueError: for an unknown device name or an unreadable size.
        TypeError: if ``max_memory`` is not a mapping.
    """
    if max_memory is None:
        return dict(sorted(_free_memory().items(), key=lambda item: _device_order(item[0])))
    if not isinstance(max_memory, Mapping):
        raise TypeError(
            f"max_memory must be a dict such as {{0: '10GiB', 'cpu': '30GiB'}}, got {type(max_memory).__name__}."
        )
    budget: dict[DeviceKey, int] = {}
    for key, value in max_memory.items():
        device = normalize_device_key(key)
        try:
            budget[device] = convert_file_size_to_int(value)
        except (ValueError, TypeError) as err:
            raise type(err)(f"max_memory[{quote_value(key)}]: {err}") from None
    return dict(sorted(budget.items(), key=lambda item: _device_order(item[0])))


def _no_split_reserve(model: nn.Module, sizes: Mapping[str, int | float], no_split: list[str]) -> int | float:
    """Size of the first module (in size-dict order) of each no-split class; the largest of them."""
    found: dict[str, int | float] = {}
    for name, size in sizes.items():
        if name == "":
            continue
        target: object = model
        for piece in name.split("."):
            target = getattr(target, piece)
        kind = type(target).__name__
        if kind in no_split and kind not in found:
            found[kind] = size
        if set(found) == set(no_split):
            break
    return max(found.values()) if found else 0


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, int | float | str] | None = None,
    no_split_module_classes: list[str] | set[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    low_zero: bool = False,
    low_zero_memory: bool | None = None,
) -> dict[DeviceKey, int | float]:
    """Lower the accelerator budgets so a model spreads evenly over all accelerators.

    Without this, :func:`infer_auto_device_map` fills the first accelerator completely before using the
    next one. As in the reference: each accelerator but the last (by index) gets at most
    ``model size // count`` plus a margin of 1.25 times the larger of the first no-split module's
    size and the mean size of the innermost modules; the last keeps its budget so that rounding
    never pushes layers to the CPU. With a single accelerator and no ``max_memory``, 90% of its free
    memory is used, leaving room for activations.

    Args:
        model: the model (``meta`` is fine).
        max_memory: budgets per device; free memory is read when None.
        no_split_module_classes: class names never split (their size sets the margin).
        dtype: count floating-point weights in this dtype.
        special_dtypes: per-tensor dtype overrides.
        low_zero: give accelerator 0 as little as possible (only what the others can not hold), to
            leave it room for work such as ``generate``.
        low_zero_memory: the same switch under its other documented name; wins when given.

    Returns:
        The balanced budgets, in the format of :func:`get_max_memory`.

    Raises:
        ValueError: for an unknown device or unreadable size in ``max_memory``.

    Example:
        >>> import torch
        >>> from accelerando import infer_auto_device_map, init_empty_weights
        >>> from accelerando.utils import get_balanced_memory
        >>> with init_empty_weights():
        ...     model = torch.nn.Sequential(*[torch.nn.Linear(1000, 1000) for _ in range(4)])  # 4 MB each
        >>> budgets = get_balanced_memory(model, max_memory={0: "1GB", 1: "1GB", "cpu": "1GB"})
        >>> budgets[0] < budgets[1]  # the first GPU gets about half the model, not all of it
        True
        >>> dict(infer_auto_device_map(model, max_memory=budgets))
        {'0': 0, '1': 0, '2': 1, '3': 1}
    """
    low_zero = bool(low_zero if low_zero_memory is None else low_zero_memory)
    user_budget = max_memory is not None
    budget: dict[DeviceKey, int | float] = dict(get_max_memory(max_memory))
    accelerators = sorted(key for key in budget if isinstance(key, int) and budget[key] > 0)
    if not accelerators:
        return budget
    if len(accelerators) == 1:
        low_zero = False  # one accelerator can not be kept low
        if not user_budget:
            first = next(key for key in budget if isinstance(key, int))
            budget[first] *= 0.9
            logger.info(
                f"We will use 90% of the memory on device {first} for storing the model, and 10% for the buffer "
                "to avoid OOM. You can set `max_memory` in to a higher value to use more memory (at your own risk)."
            )
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_device = sizes[""] // (len(accelerators) - 1 if low_zero else len(accelerators))
    no_split_module_classes = as_class_name_list(no_split_module_classes)
    margin = _no_split_reserve(model, sizes, list(no_split_module_classes)) if no_split_module_classes else 0
    # The leaves of the size dict are tensors; without them, the leaves are the innermost modules.
    leaves = set(get_module_leaves(sizes))
    module_sizes = {name: size for name, size in sizes.items() if name not in leaves}
    leaves_of_modules = get_module_leaves(module_sizes)
    mean = int(sum(module_sizes[name] for name in leaves_of_modules) / max(len(leaves_of_modules), 1))
    per_device += int(1.25 * max(margin, mean))
    for key in accelerators[:-1]:
        budget[key] = min(budget.get(0, 0) if low_zero and key == 0 else per_device, budget[key])
    if low_zero:
        others = sum(budget.get(index, 0) for index in range(1, len(accelerators)))
        budget[0] = min(max(0, module_sizes[""] - others), budget.get(0, 0))
    return budget
