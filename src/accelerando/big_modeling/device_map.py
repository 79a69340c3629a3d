"""Device maps: decide where each part of a model lives, in one linear pass over the module tree.

The walk keeps a stack of units (modules or single tensors) in forward order. A unit that fits on
the current device goes there; one that does not is split into its children when allowed, or
pushed to the next device. Every unit is looked at a bounded number of times (once per split and
once per device change), so the cost is linear in the number of modules, unlike approaches that
rescan the remaining modules for every decision.
"""

from __future__ import annotations

import gc
from collections import defaultdict

import torch
from torch import nn

from accelerando.big_modeling.budgets import DeviceKey, get_max_memory
from accelerando.big_modeling.sizes import _tensor_size, parse_dtype

__all__ = ["check_device_map", "clean_device_map", "infer_auto_device_map"]

_OFFLOAD = ("cpu", "disk")


class _Scan:
    """Everything the planner needs from the model, read in one walk over its modules.

    Large models do not fit in CPU caches, so every extra pass over the module objects costs cache
    misses; the planner and the clean-up then work on these plain dicts only.

    Attributes:
        names: module names in pre-order (a module registered twice appears under both names).
        parts: module name -> its parts in order: ``(tensor name, False)`` then ``(child name, True)``.
        kinds: module name -> class name.
        sizes: module and tensor name -> bytes (shared tensors counted once, under their first name).
        buffers: total bytes of buffers.
        partners: first name of each tied parameter -> modules owning its other names.
    """

    def __init__(self, model: nn.Module, dtype, special_dtypes) -> None:
        dtype = parse_dtype(dtype)
        self.names: list[str] = []
        self.parts: dict[str, list[tuple[str, bool]]] = {}
        self.kinds: dict[str, str] = {}
        self.sizes: dict[str, int] = defaultdict(int)
        self.buffers = 0
        self.partners: dict[str, list[str]] = {}
        first: dict[int, str] = {}
        stack: list[tuple[str, nn.Module]] = [("", model)]
        while stack:
            name, module = stack.pop()
            prefix = f"{name}." if name else ""
            own: list[tuple[str, bool]] = []
            total = self._tensors(name, prefix, module._parameters, own, first, dtype, special_dtypes)
            buffers = self._tensors(name, prefix, module._buffers, own, first, dtype, special_dtypes)
            self.buffers += buffers
            children = [(prefix + key, child) for key, child in module._modules.items() if child is not None]
            own.extend((child_name, True) for child_name, _ in children)
            self.names.append(name)
            self.parts[name] = own
            self.kinds[name] = type(module).__name__
            self.sizes[name] += total + buffers
            stack.extend(reversed(children))
        for name in reversed(self.names[1:]):
            self.sizes[name.rpartition(".")[0]] += self.sizes[name]

    def _tensors(self, name, prefix, tensors, own, first, dtype, special_dtypes) -> int:
        total = 0
        for key, tensor in tensors.items():
            if tensor is None:
                continue
            full = prefix + key
            own.append((full, False))
            if id(tensor) in first:
                self.partners.setdefault(first[id(tensor)], []).append(name)
                continue
            first[id(tensor)] = full
            size = _tensor_size(full, tensor, dtype, special_dtypes)
            self.sizes[full] = size
            total += size
        return total

    def max_layer(self, no_split: set[str]) -> tuple[int, list[str]]:
        """Largest unit that can not be split (a leaf or a no-split module) and its names."""
        best, names = 0, []
        stack = [part for part, is_module in reversed(self.parts[""]) if is_module]
        while stack:
            name = stack.pop()
            children = [part for part, is_module in self.parts[name] if is_module]
            if children and self.kinds[name] not in no_split:
                stack.extend(reversed(children))
                continue
            size = self.sizes.get(name, 0)
            if size > best:
                best, names = size, [name]
            elif size == best and size:
                names.append(name)
        return best, names


def _partners_by_unit(partners: dict[str, list[str]]) -> dict[str, list[tuple[str, str]]]:
    """Index ``(canonical tensor, partner module)`` pairs under every ancestor of the canonical name."""
    by_unit: dict[str, list[tuple[str, str]]] = {}
    for canonical, owners in partners.items():
        pieces = canonical.split(".")
        for depth in range(1, len(pieces) + 1):
            unit = ".".join(pieces[:depth])
            by_unit.setdefault(unit, []).extend((canonical, owner) for owner in owners)
    return by_unit


class _Planner:
    """State of one device-map computation (kept in an object so each step stays a short method)."""

    def __init__(self, scan: _Scan, budget, no_split: set[str], verbose: bool, reserve: int) -> None:
        self.devices: list[DeviceKey] = list(budget)
        if "disk" not in budget:
            self.devices.append("disk")
        self.budget = {key: float(value) for key, value in budget.items()}
        self.budget["disk"] = float("inf")
        self.scan = scan
        self.sizes = scan.sizes
        self.no_split = no_split
        self.verbose = verbose
        self.reserve = reserve
        self.partners = _partners_by_unit(scan.partners)
        self.used = dict.fromkeys(self.devices, 0)
        self.index = 0
        self.device_map: dict[str, DeviceKey] = {}
        self.preplaced: set[str] = set()
        self.preplaced_size: dict[str, int] = {}
        self.stack: list[tuple[str, bool]] = list(reversed(scan.parts[""]))

    def log(self, message: str) -> None:
        if self.verbose:
            print(message)

    def capacity(self, device: DeviceKey) -> float:
        return self.budget[device] - (self.reserve if self.index == 0 else 0)

    def unit_partners(self, name: str) -> tuple[list[str], DeviceKey | None]:
        """Tied partner modules outside ``name``: those still unplaced, and the device of placed ones."""
        inside = f"{name}."
        pending: list[str] = []
        bound = None
        for _, owner in self.partners.get(name, ()):
            if owner == name or owner.startswith(inside):
                continue
            if owner in self.device_map:
                bound = self.device_map[owner]
            elif owner not in pending:
                pending.append(owner)
        return pending, bound

    def place(self, name: str, device: DeviceKey, size: int, partners: list[str]) -> None:
        self.device_map[name] = device
        self.used[device] += size
        for owner in partners:
            self.device_map[owner] = device
            self.preplaced.add(owner)
            pieces = owner.split(".")
            for depth in range(len(pieces)):
                ancestor = ".".join(pieces[:depth])
                self.preplaced_size[ancestor] = self.preplaced_size.get(ancestor, 0) + self.sizes.get(
                    owner, 0
                )
        extra = f" with its tied partners {partners}" if partners else ""
        self.log(f"Putting {name!r} ({size} bytes){extra} on {device!r}.")

    def splittable(self, name: str, is_module: bool) -> bool:
        if not is_module or self.scan.kinds[name] in self.no_split:
            return False
        return any(child for _, child in self.scan.parts[name])

    def step(self, name: str, module: bool) -> None:
        if name in self.preplaced:
            return
        device = self.devices[self.index]
        partners, bound = self.unit_partners(name)
        size = self.sizes.get(name, 0) - self.preplaced_size.get(name, 0)
        size += sum(self.sizes.get(owner, 0) for owner in partners)
        splittable = self.splittable(name, module)
        if name in self.preplaced_size and splittable:
            self.log(f"Splitting {name!r}: part of it was already placed with a tied partner.")
            self.stack.extend(reversed(self.scan.parts[name]))
        elif bound is not None and (not splittable or self.used[bound] + size <= self.budget[bound]):
            # A tied weight must share the device its other names were placed on.
            self.place(name, bound, size, partners)
        elif bound is None and self.used[device] + size <= self.capacity(device):
            self.place(name, device, size, partners)
        elif splittable:
            target = device if bound is None else bound
            self.log(f"Splitting {name!r} ({size} bytes): it does not fit on {target!r} as a whole.")
            self.stack.extend(reversed(self.scan.parts[name]))
        else:
            self.log(
                f"{name!r} ({size} bytes) does not fit on {device!r} and can not be split; using the next device."
            )
            self.stack.append((name, module))
            self.index += 1

    def fallback(self) -> None:
        """Put on the current (still empty) device the first pending unit that fits there whole."""
        device = self.devices[self.index]
        for position in range(len(self.stack) - 1, -1, -1):
            name, _ = self.stack[position]
            size = self.sizes.get(name, 0)
            if name not in self.preplaced and 0 < size <= self.capacity(device):
                del self.stack[position]
                self.place(name, device, size, [])
                return

    def run(self, fallback_allocation: bool) -> dict[str, DeviceKey]:
        while self.stack:
            name, module = self.stack.pop()
            before = self.index
            self.step(name, module)
            if fallback_allocation and self.index != before and self.used[self.devices[before]] == 0:
                self.index = before
                self.fallback()
                self.index += 1
        return self.device_map


def _clean_with_scan(device_map: dict[str, DeviceKey], scan: _Scan) -> dict[str, DeviceKey]:
    """Merge entries whose parts all go to one device into their parent, using the model's tree.

    Linear in the model's size; keeps the model's module order.
    """
    result = dict(device_map)
    order: dict[str, None] = {}
    for name in scan.names:
        order[name] = None
        order.update((part, None) for part, _ in scan.parts[name])
    for name in reversed(scan.names):
        parts = scan.parts[name]
        if name in result or not parts:
            continue
        targets = set()
        for part, _ in parts:
            if part not in result:
                break
            targets.add(result[part])
        else:
            if len(targets) == 1:
                for part, _ in parts:
                    del result[part]
                result[name] = targets.pop()
    ordered = {name: result[name] for name in order if name in result}
    ordered.update((name, device) for name, device in result.items() if name not in ordered)
    return ordered


def _under(key: str, prefix: str) -> bool:
    return not prefix or key.startswith(prefix)


def clean_device_map(
    device_map: dict[str, DeviceKey], module_name: str = "", *, model: nn.Module | None = None
) -> dict[str, DeviceKey]:
    """Merge the entries below a module that all go to one device into one entry for that module.

    Works from the names alone: starting at ``module_name`` (the whole map for ``""``), when every
    entry under a module name maps to the same device, those entries are replaced by one entry for the
    module (placed where the first of them was); otherwise each child name is examined the same way.
    ``device_map`` is updated in place and returned.

    Args:
        device_map: module (or tensor) name -> device.
        module_name: the module below which to merge (``""``: everywhere, so a map whose entries all
            name one device becomes ``{"": device}``).
        model: optionally the model the map describes; then the model's tree decides what a parent
            covers (an entry merges into its parent only when every part of that parent is mapped),
            and the order is the model's module order.

    Returns:
        ``device_map``, shortened.
    """
    if model is not None:
        cleaned = _clean_with_scan(device_map, _Scan(model, None, None))
        device_map.clear()
        device_map.update(cleaned)
        return device_map
    pending = [module_name]
    while pending:
        name = pending.pop()
        prefix = f"{name}." if name else ""
        keys = [key for key in device_map if _under(key, prefix)]
        if not keys:
            continue
        devices = {str(device_map[key]) for key in keys}
        if len(devices) == 1:
            device = device_map[keys[0]]
            merged = set(keys)
            items = list(device_map.items())
            device_map.clear()
            for key, value in items:
                if key == keys[0]:
                    device_map[name] = device
                elif key not in merged:
                    device_map[key] = value
            continue
        children = dict.fromkeys(
            prefix + key[len(prefix) :].split(".")[0] for key in keys if len(key) > len(prefix)
        )
        pending.extend(reversed(children))
    return device_map


def check_device_map(model: nn.Module, device_map: dict[str, int | str | torch.device]) -> None:
    """Check that a device map gives a device to every parameter and persistent buffer of the model.

    An entry covers a tensor when it names the tensor or one of its parent modules (``""`` covers
    everything).

    Args:
        model: the model.
        device_map: module (or tensor) name -> device.

    Raises:
        ValueError: naming the tensors no entry covers, and how to fix the map.
    """
    if "" in device_map:
        return
    uncovered = []
    for name in model.state_dict(keep_vars=True):
        probe = name
        while probe and probe not in device_map:
            probe = probe.rpartition(".")[0]
        if not probe:
            uncovered.append(name)
    if uncovered:
        shown = ", ".join(uncovered[:10]) + (
            f" ... and {len(uncovered) - 10} more" if len(uncovered) > 10 else ""
        )
        raise ValueError(
            f"The device_map does not cover these tensors of the model (no device for them): {shown}. Add entries for their "
            "modules (or a '' entry for the whole model)."
        )


def infer_auto_device_map(
    model: nn.Module,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: dict[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Compute a device map: fill the accelerators in order, then the CPU, then the disk.

    Guarantees: a module whose class name is in ``no_split_module_classes`` is never split; tied
    parameters land on one device; each device's share stays within its budget; when some weights
    will be offloaded, the first (execution) device keeps room for the largest layer, which is
    brought there to run, and for the buffers of offloaded modules unless ``offload_buffers``.
    Runs in time linear in the number of modules.

    Args:
        model: the model to place (build it under :func:`init_empty_weights` to allocate nothing).
        max_memory: budgets per device (bytes or strings like ``"10GiB"``); free memory when None.
        no_split_module_classes: class names whose instances stay on one device (residual blocks).
        dtype: count floating-point weights in this dtype (the dtype you will load in).
        special_dtypes: per-tensor dtype overrides.
        verbose: print each decision (placement, split, move to the next device) and why.
        clean_result: merge entries whose parts share a device into their parent.
        offload_buffers: offloaded modules also offload their buffers (no main-device reserve for them).
        fallback_allocation: when the first unit does not fit on a device, put the first later unit
            that does fit there instead of leaving the device empty.

    Returns:
        An ordered dict from module (or tensor) names to a device: an accelerator index, ``"mps"``,
        ``"xpu:0"``-style names, ``"cpu"`` or ``"disk"``.

    Raises:
        ValueError: for an unknown device or unreadable size in ``max_memory``.
    """
    budget = get_max_memory(max_memory)
    # The cyclic garbage collector scans the whole heap (the model's objects included) each time it
    # runs, which would make this pass superlinear on large models; nothing here creates cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _infer(model, budget, no_split_module_classes, dtype, special_dtypes, verbose, clean_result,
                      offload_buffers, fallback_allocation)  # fmt: skip
    finally:
        if collecting:
            gc.enable()


def _infer(model, budget, no_split_module_classes, dtype, special_dtypes, verbose, clean_result, offload_buffers,
           fallback_allocation) -> dict[str, DeviceKey]:  # fmt: skip
    scan = _scan(model, dtype, special_dtypes)
    total = scan.sizes.get("", 0)
    no_split = set(no_split_module_classes or ())
    devices = list(budget)
    main = devices[0] if devices else "cpu"
    on_main_side = [key for key in devices if key not in _OFFLOAD] or ([main] if main == "cpu" else [])
    if clean_result and devices and total <= budget[main]:
        if verbose:
            print(f"The whole model ({total} bytes) fits on {main!r}.")
        return {"": main}
    reserve = 0
    if total > sum(budget[key] for key in on_main_side):
        reserve, names = scan.max_layer(no_split)
        if not offload_buffers:
            reserve += scan.buffers
        if verbose:
            print(
                f"The model does not fit on {on_main_side}: reserving {reserve} bytes on {main!r} for {names}."
            )
    device_map = _Planner(scan, budget, no_split, verbose, reserve).run(fallback_allocation)
    if not clean_result:
        return device_map
    if len(set(device_map.values())) == 1:
        return {"": next(iter(device_map.values()))}
    return _clean_with_scan(device_map, scan)


def _scan(model: nn.Module, dtype, special_dtypes) -> _Scan:
    return _Scan(model, dtype, special_dtypes)
